"""Prices, and what a run cost: dollars per million output tokens, per 1,000 requests and per
session (ARCHITECTURE.md, "Cost and energy").

A price table is an API vendor's or a self-hosted deployment's, never both (US dollars)::

    API vendor    usd_per_million_input_tokens, usd_per_million_output_tokens (both needed),
                  usd_per_million_cached_input_tokens (default: the input price),
                  usd_per_request (default 0)
    self-hosted   usd_per_gpu_hour and gpus (default 1), or usd_per_node_hour and nodes
    either        usd_per_kwh: electricity, for the energy cost (``loadlab._analysis.telemetry``)

API: each ok request sent inside the measurement window costs
``(uncached input x p_in + cached input x p_cached + output x p_out) / 1e6 + p_request``, its
tokens from the server's usage (``prompt_tokens``, the cached ones, ``completion_tokens``);
failed requests are not priced. Self-hosted: GPUs x the window's hours x the GPU-hour price,
over the window's output tokens, completed requests and sessions (as ``metrics.throughput``
counts them). Per million output tokens = bill / output tokens x 1e6.

A pricing file (TOML) holds a table for every endpoint at its top level, and per-endpoint
tables under ``[endpoints.NAME]`` that add to it or override it::

    usd_per_kwh = 0.12
    [endpoints.vendor]
    usd_per_million_input_tokens = 0.15
    usd_per_million_output_tokens = 0.60

Example::

    cost = cost_of(read_results("reports/run.json"))   # None: the run has no prices
    cost.usd_per_million_output_tokens
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loadlab._analysis import metrics
from loadlab._analysis.columns import columns_of
from loadlab.errors import ConfigError, read_toml
from loadlab.records import RequestRecord

if TYPE_CHECKING:
    from loadlab.results import Results

__all__ = [
    "ALL_ENDPOINTS",
    "COST_METRICS",
    "CostSummary",
    "Pricing",
    "apply_pricing",
    "check_tables",
    "completed_in",
    "cost_of",
    "cost_units",
    "endpoint_name",
    "load_pricing",
    "parse_price_flags",
    "pricing_of",
    "pricing_tables",
    "run_cost",
    "unpriced",
]

ALL_ENDPOINTS = "*"  # the key of the table that applies to every endpoint
# Whole-run cost figures an SLO objective may name (``usd_per_million_output_tokens <= 2``).
COST_METRICS = ("usd_per_million_output_tokens", "usd_per_1k_requests", "usd_per_session")
# ``--price`` short names -> price-table keys
SHORT_KEYS = {
    "input": "usd_per_million_input_tokens",
    "cached_input": "usd_per_million_cached_input_tokens",
    "output": "usd_per_million_output_tokens",
    "request": "usd_per_request",
    "gpu_hour": "usd_per_gpu_hour",
    "gpus": "gpus",
    "node_hour": "usd_per_node_hour",
    "nodes": "nodes",
    "kwh": "usd_per_kwh",
}
_API_KEYS = (
    "usd_per_million_input_tokens",
    "usd_per_million_cached_input_tokens",
    "usd_per_million_output_tokens",
    "usd_per_request",
)
_COUNTS = ("gpus", "nodes")
NS_PER_HOUR = 3600 * metrics.NS_PER_S


@dataclass(frozen=True)
class Pricing:
    """One endpoint's prices (see the module docstring); ``None``: not given."""

    usd_per_million_input_tokens: float | None = None
    usd_per_million_cached_input_tokens: float | None = None
    usd_per_million_output_tokens: float | None = None
    usd_per_request: float | None = None
    usd_per_gpu_hour: float | None = None
    gpus: int | None = None
    usd_per_node_hour: float | None = None
    nodes: int | None = None
    usd_per_kwh: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name in _COUNTS:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{f.name} must be a whole number >= 1, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{f.name} must be a number of dollars, got {value!r}")
            elif not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{f.name} must be a finite number >= 0, got {value!r}")
        api = [k for k in _API_KEYS if getattr(self, k) is not None]
        hosted = [
            k for k in ("usd_per_gpu_hour", "usd_per_node_hour") if getattr(self, k) is not None
        ]
        if api and hosted:
            raise ValueError(
                f"a price table is an API vendor's ({', '.join(api)}) or a self-hosted "
                f"deployment's ({', '.join(hosted)}), not both: give each endpoint its own table"
            )
        if len(hosted) > 1:
            raise ValueError("give usd_per_gpu_hour (with gpus) or usd_per_node_hour, not both")
        if self.gpus is not None and self.usd_per_gpu_hour is None:
            raise ValueError("gpus needs usd_per_gpu_hour")
        if self.nodes is not None and self.usd_per_node_hour is None:
            raise ValueError("nodes needs usd_per_node_hour")
        if api:
            need = ("usd_per_million_input_tokens", "usd_per_million_output_tokens")
            gone = [k for k in need if getattr(self, k) is None]
            if gone:
                raise ValueError(
                    f"an API price table needs {' and '.join(gone)} (write 0 where it is free)"
                )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "pricing") -> Pricing:
        """A price table from plain data; ``ConfigError`` naming ``where`` and the key."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown price keys {unknown}; known: {sorted(known)}")
        try:
            return cls(**dict(data))
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    @property
    def kind(self) -> str | None:
        """``"api"``, ``"self_hosted"``, or ``None`` (only an electricity price)."""
        if self.usd_per_million_output_tokens is not None:
            return "api"
        if self.usd_per_gpu_hour is not None or self.usd_per_node_hour is not None:
            return "self_hosted"
        return None

    @property
    def usd_per_hour(self) -> float:
        """Self-hosted: GPUs x GPU-hour price, or nodes x node-hour price."""
        if self.usd_per_gpu_hour is not None:
            return self.usd_per_gpu_hour * (self.gpus or 1)
        return (self.usd_per_node_hour or 0.0) * (self.nodes or 1)

    def request_usd(self, r: RequestRecord) -> float:
        """An API request's price from its usage (input uncached and cached, output)."""
        p_in = self.usd_per_million_input_tokens or 0.0
        p_cached = self.usd_per_million_cached_input_tokens
        p_cached = p_in if p_cached is None else p_cached
        prompt = r.prompt_tokens if r.prompt_tokens is not None else r.prompt_tokens_requested or 0
        cached = min(r.cached_prompt_tokens or 0, prompt)
        out = metrics.output_token_count(r)
        tokens_usd = (prompt - cached) * p_in + cached * p_cached
        tokens_usd += out * (self.usd_per_million_output_tokens or 0.0)
        return tokens_usd / 1e6 + (self.usd_per_request or 0.0)

    def describe(self) -> str:
        """One line: ``API $0.15 in, $0.075 cached in, $0.6 out per million tokens``."""
        parts = []
        if self.kind == "api":
            cached = self.usd_per_million_cached_input_tokens
            parts.append(
                f"API ${self.usd_per_million_input_tokens:g} in, "
                + (f"${cached:g} cached in, " if cached is not None else "")
                + f"${self.usd_per_million_output_tokens:g} out per million tokens"
                + (f", ${self.usd_per_request:g} per request" if self.usd_per_request else "")
            )
        elif self.usd_per_gpu_hour is not None:
            parts.append(
                f"self-hosted {self.gpus or 1} GPU(s) x ${self.usd_per_gpu_hour:g}/GPU-hour"
            )
        elif self.usd_per_node_hour is not None:
            parts.append(
                f"self-hosted {self.nodes or 1} node(s) x ${self.usd_per_node_hour:g}/node-hour"
            )
        if self.usd_per_kwh is not None:
            parts.append(f"electricity ${self.usd_per_kwh:g}/kWh")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }


def _table(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table of price = number")
    return dict(raw)


def load_pricing(path: str | Path) -> dict[str, dict[str, Any]]:
    """A pricing file read and checked: ``{"*": top-level table, NAME: [endpoints.NAME]}``."""
    p = Path(path)
    data = read_toml(p, ConfigError, "it", where=f"--pricing {p}")
    endpoints = _table(data.pop("endpoints", {}), f"--pricing {p}: [endpoints]")
    tables = {ALL_ENDPOINTS: data} if data else {}
    for name, raw in endpoints.items():
        tables[str(name)] = _table(raw, f"--pricing {p}: [endpoints.{name}]")
    return check_tables(tables, f"--pricing {p}")


def check_tables(tables: Mapping[str, Mapping[str, Any]], where: str) -> dict[str, dict[str, Any]]:
    """Every endpoint's merged table (the common one, then its own) must be a valid price table."""
    common = dict(tables.get(ALL_ENDPOINTS, {}))
    out = {}
    for name, table in tables.items():
        label = where if name == ALL_ENDPOINTS else f"{where} [endpoints.{name}]"
        merged = common if name == ALL_ENDPOINTS else {**common, **table}
        Pricing.from_dict(merged, label)
        out[name] = dict(table)
    return out


def unpriced(tables: Mapping[str, Mapping[str, Any]], names: Iterable[str]) -> None:
    """``ConfigError`` when price tables name endpoints but leave one of ``names`` (the run's)
    without a price: a misspelt name would otherwise drop the cost without a word."""
    others = sorted(set(tables) - set(names) - {ALL_ENDPOINTS})
    common = tables.get(ALL_ENDPOINTS, {})
    bare = sorted(n for n in names if not Pricing.from_dict({**common, **tables.get(n, {})}).kind)
    if bare and others:
        raise ConfigError(
            f"pricing: no prices for endpoint {', '.join(bare)}; the price tables name "
            f"{', '.join(others)}: name the endpoints so (--endpoint NAME=URL)"
        )


def parse_price_flags(texts: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``--price [ENDPOINT:]KEY=VALUE[,KEY=VALUE]`` (repeatable) -> tables by endpoint.

    >>> parse_price_flags(["output=0.6,input=0.15", "ours:gpu_hour=2.5,gpus=8"])
    {'*': {'usd_per_million_output_tokens': 0.6, 'usd_per_million_input_tokens': 0.15}, \
'ours': {'usd_per_gpu_hour': 2.5, 'gpus': 8}}
    """
    out: dict[str, dict[str, Any]] = {}
    for text in texts:
        head, sep, rest = text.partition(":")
        name, body = (head, rest) if sep and "=" not in head else (ALL_ENDPOINTS, text)
        for item in body.split(","):
            key, eq, value = item.strip().partition("=")
            key = SHORT_KEYS.get(key.strip(), key.strip())
            if not eq or key not in {f.name for f in fields(Pricing)}:
                short = ", ".join(SHORT_KEYS)
                raise ConfigError(
                    f"--price {text!r}: write [ENDPOINT:]KEY=VALUE[,KEY=VALUE] with KEY one of "
                    f"{short} (or a pricing-file key)"
                )
            try:
                number: float | int = int(value) if key in _COUNTS else float(value)
            except ValueError:
                raise ConfigError(
                    f"--price {text!r}: {key} must be a number, got {value!r}"
                ) from None
            out.setdefault(name, {})[key] = number
    return out


def pricing_tables(
    path: str | None, flags: Sequence[str] | None, base: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, dict[str, Any]]:
    """A run's price tables: the scenario's, then ``--pricing FILE``, then ``--price`` flags
    (each key a later source gives wins)."""
    tables: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (base or {}).items()}
    for source in (load_pricing(path) if path else {}, parse_price_flags(flags or ())):
        for name, table in source.items():
            tables[name] = {**tables.get(name, {}), **table}
    return check_tables(tables, "--pricing/--price")


def endpoint_name(results: Results) -> str:
    """The endpoint a results file measured (its records' label, else its only endpoint)."""
    codes, names = columns_of(results.records).coded["endpoint"]
    said = [i for i, name in enumerate(names) if name]
    if said:  # the first record's that has one (a million records: one pass over codes)
        return str(names[codes[np.isin(codes, said)][0]])
    eps = results.config.get("endpoints") or []
    return str(eps[0].get("name", "")) if len(eps) == 1 and isinstance(eps[0], Mapping) else ""


def pricing_of(results: Results, label: str | None = None) -> Pricing | None:
    """The prices of a run: ``extra["pricing"]`` (prices applied after the run), else its
    config's tables for its endpoint (or ``label``). ``None`` when it has none."""
    table = results.extra.get("pricing")
    if not isinstance(table, Mapping):
        tables = results.config.get("pricing") or {}
        if not isinstance(tables, Mapping) or not tables:
            return None
        name = label if label in tables else endpoint_name(results)
        table = {**tables.get(ALL_ENDPOINTS, {}), **tables.get(name, {})}
    return Pricing.from_dict(table, "the results file's prices") if table else None


def apply_pricing(results: Results, path: str, label: str | None = None) -> None:
    """Price a run after the fact: ``path``'s table for ``label`` (else the run's endpoint)."""
    tables = load_pricing(path)
    name = label if label in tables else endpoint_name(results)
    table = {**tables.get(ALL_ENDPOINTS, {}), **tables.get(name, {})}
    if table:
        results.extra["pricing"] = table


@dataclass(frozen=True)
class CostSummary:
    """What a run's priced work cost, and that bill divided over what it bought."""

    kind: str  # "api" | "self_hosted"
    usd: float
    output_tokens: float
    requests: int
    sessions: int
    input_tokens: int = 0  # API: prompt tokens priced, of which cached
    cached_input_tokens: int = 0
    usage_requests: int = 0  # API: requests whose output count is the server's usage
    hours: float = 0.0  # self-hosted: the window's length

    @property
    def usd_per_million_output_tokens(self) -> float | None:
        return self.usd / self.output_tokens * 1e6 if self.output_tokens else None

    @property
    def usd_per_1k_requests(self) -> float | None:
        return self.usd / self.requests * 1000 if self.requests else None

    @property
    def usd_per_session(self) -> float | None:
        return self.usd / self.sessions if self.sessions else None

    def figure(self, metric: str) -> float | None:
        """One of ``COST_METRICS`` by name."""
        if metric not in COST_METRICS:
            raise ValueError(f"unknown cost metric {metric!r}; known: {', '.join(COST_METRICS)}")
        value: float | None = getattr(self, metric)
        return value

    def to_dict(self) -> dict[str, Any]:
        out = {
            k: getattr(self, k) for k in ("kind", "usd", "output_tokens", "requests", "sessions")
        }
        out.update({m: self.figure(m) for m in COST_METRICS})
        return out


def _session(r: RequestRecord) -> str:
    return r.session_id if r.session_id is not None else "\0" + r.request_id


def completed_in(records: Iterable[RequestRecord], window: tuple[int, int]) -> list[RequestRecord]:
    """Ok requests that completed inside the window (what requests/s counts)."""
    lo, hi = window
    return [r for r in records if r.ok and r.chunk_ns and lo <= r.chunk_ns[-1] <= hi]


def run_cost(
    records: Sequence[RequestRecord], window: tuple[int, int], pricing: Pricing
) -> CostSummary | None:
    """The bill of the window's work at ``pricing`` (``None`` for an electricity-only table)."""
    if pricing.kind == "api":
        priced = metrics.latency_records(records, window)
        prompts = [r.prompt_tokens if r.prompt_tokens is not None else r.prompt_tokens_requested or 0
                   for r in priced]  # fmt: skip
        return CostSummary(
            kind="api",
            usd=sum(pricing.request_usd(r) for r in priced),
            output_tokens=float(sum(metrics.output_token_count(r) for r in priced)),
            requests=len(priced),
            sessions=len({_session(r) for r in priced}),
            input_tokens=sum(prompts),
            cached_input_tokens=sum(
                min(r.cached_prompt_tokens or 0, p) for r, p in zip(priced, prompts, strict=True)
            ),
            usage_requests=sum(1 for r in priced if r.output_tokens_source == "usage"),
        )
    if pricing.kind == "self_hosted":
        lo, hi = window
        done = completed_in(records, window)
        hours = (hi - lo) / NS_PER_HOUR
        return CostSummary(
            kind="self_hosted",
            usd=pricing.usd_per_hour * hours,
            output_tokens=metrics.throughput(records, window).output_tokens,
            requests=len(done),
            sessions=len({_session(r) for r in done}),
            hours=hours,
        )
    return None


def cost_of(results: Results, label: str | None = None) -> CostSummary | None:
    """A run's cost at its own prices (``pricing_of``); ``None`` when it has none."""
    pricing = pricing_of(results, label)
    if pricing is None:
        return None
    return run_cost(results.records, results.measurement_window_ns(), pricing)


def cost_units(results: Results, pricing: Pricing) -> np.ndarray:
    """The bill split into the units a bootstrap resamples: ``[units, 4]`` rows of (dollars,
    output tokens, requests, sessions) whose columns add up to the run's ``CostSummary``.

    API: one unit per session (a request without one is its own), so a session's requests
    move together. Self-hosted: one unit per second of the window (the last one shorter),
    each carrying its share of the hourly price and what completed in it, as the throughput
    row of a comparison resamples whole seconds."""
    window = results.measurement_window_ns()
    if pricing.kind == "api":
        by: dict[str, list[float]] = {}
        for r in metrics.latency_records(results.records, window):
            row = by.setdefault(_session(r), [0.0, 0.0, 0.0, 1.0])
            row[0] += pricing.request_usd(r)
            row[1] += metrics.output_token_count(r)
            row[2] += 1
        return np.asarray(list(by.values()), dtype=float).reshape(-1, 4)
    lo, hi = window
    n = max(1, math.ceil((hi - lo) / metrics.NS_PER_S))
    units = np.zeros((n, 4))
    edges = lo + np.arange(n + 1) * metrics.NS_PER_S
    edges[-1] = hi
    units[:, 0] = pricing.usd_per_hour * np.diff(edges) / NS_PER_HOUR
    last_of: dict[str, int] = {}
    for r in results.records:
        times = np.asarray(r.chunk_ns, dtype=np.int64)
        inside = (times >= lo) & (times <= hi)
        if inside.any():
            bins = np.minimum((times[inside] - lo) // metrics.NS_PER_S, n - 1)
            weights = np.asarray(metrics._chunk_token_weights(r))[inside]
            np.add.at(units[:, 1], bins, weights)
    for r in completed_in(results.records, window):
        b = min((r.chunk_ns[-1] - lo) // metrics.NS_PER_S, n - 1)
        units[b, 2] += 1
        last_of[_session(r)] = max(last_of.get(_session(r), b), b)
    for b in last_of.values():
        units[b, 3] += 1
    return units
