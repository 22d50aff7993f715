"""The SLO file (TOML): objectives, per-request limits for goodput, per-class objectives.

See ``loadlab._slo`` for the file format. Example::

    spec = load_slo("examples/slo.toml")
    [str(o) for o in spec.objectives]      # ["ttft_ms.p95 <= 500", ...]
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from loadlab._analysis import cost, metrics, telemetry
from loadlab.errors import SLOError, at_least, read_toml

__all__ = [
    "COST_METRICS",
    "DIST_METRICS",
    "RATE_METRICS",
    "Objective",
    "Policy",
    "SLOError",
    "SLOSpec",
    "Status",
    "load_slo",
    "parse_objective",
    "parse_slo",
]

DIST_METRICS = (*metrics.LATENCY_METRICS, *metrics.TOKEN_METRICS)
# Whole-run figures (no percentile). error_rate = failed / sent; drop_rate = dropped / scheduled.
RATE_METRICS = (
    "error_rate",
    "drop_rate",
    "goodput_rps",
    "output_tokens_per_s",
    "total_tokens_per_s",
    "requests_per_s",
    "inputs_per_s",  # embeddings and rerank
    "input_tokens_per_s",
)
# What the run cost and the energy it used (docs/cost.md): whole-run figures from its prices
# and GPU telemetry, e.g. "usd_per_million_output_tokens <= 2.0".
COST_METRICS = (*cost.COST_METRICS, *telemetry.ENERGY_METRICS)
Status = Literal["pass", "fail", "inconclusive"]
Policy = Literal["fail", "pass"]
_OPS = ("<=", ">=", "<", ">")
_OBJECTIVE = re.compile(
    r"^\s*(?P<metric>[a-z][a-z0-9_]*)(?:\.p(?P<q>\d+(?:\.\d+)?))?\s*(?P<op><=|>=|<|>)\s*"
    r"(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)
_TOP_KEYS = {"name", "min_requests", "confidence", "objectives", "request", "classes"}
_CLASS_KEYS = {"objectives", "request"}


@dataclass(frozen=True)
class Objective:
    """One objective: ``metric[.pNN] op threshold``, optionally for one request class."""

    metric: str
    op: str
    threshold: float
    percentile: float | None = None  # 95.0 for "ttft_ms.p95"
    request_class: str | None = None

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"operator must be one of {', '.join(_OPS)}, got {self.op!r}")
        if self.metric in DIST_METRICS:
            if self.percentile is None or not 0 < self.percentile < 100:
                raise ValueError(
                    f"{self.metric} needs a percentile between 0 and 100, "
                    f"e.g. {self.metric}.p95 <= 500"
                )
        elif self.metric in RATE_METRICS or self.metric in COST_METRICS:
            if self.percentile is not None:
                raise ValueError(f"{self.metric} is a whole-run figure: drop the .p suffix")
        else:
            known = ", ".join(DIST_METRICS + RATE_METRICS + COST_METRICS)
            raise ValueError(f"unknown metric {self.metric!r}; known: {known}")
        if not math.isfinite(self.threshold):
            raise ValueError(f"threshold must be a finite number, got {self.threshold}")
        self._check_can_pass()

    def _check_can_pass(self) -> None:
        """Refuse an objective no run can meet: every metric is >= 0 (latencies, tokens,
        rates), and error_rate and drop_rate are at most 1."""
        t, hi = self.threshold, (1.0 if self.metric in ("error_rate", "drop_rate") else math.inf)
        never = {"<=": t < 0, "<": t <= 0, ">=": t > hi, ">": t >= hi}[self.op]
        if never:
            what = "a fraction from 0 to 1" if hi == 1.0 else "never negative"
            raise ValueError(f"{self} can never pass: {self.metric} is {what}")

    @property
    def name(self) -> str:
        stat = f".p{self.percentile:g}" if self.percentile is not None else ""
        cls = f"[{self.request_class}]" if self.request_class else ""
        return f"{self.metric}{stat}{cls}"

    @property
    def upper_bound(self) -> bool:
        """True for "at most" objectives (<=, <)."""
        return self.op in ("<=", "<")

    def holds(self, value: float) -> bool:
        return {
            "<=": value <= self.threshold,
            "<": value < self.threshold,
            ">=": value >= self.threshold,
            ">": value > self.threshold,
        }[self.op]

    def __str__(self) -> str:
        return f"{self.name} {self.op} {self.threshold:g}"


def parse_objective(text: str, request_class: str | None = None) -> Objective:
    """``parse_objective("ttft_ms.p95 <= 500")`` -> Objective("ttft_ms", "<=", 500.0, 95.0)."""
    m = _OBJECTIVE.match(text)
    if m is None:
        raise ValueError(
            f"cannot read objective {text!r}; write it as 'metric.pNN <= number' "
            f"(e.g. 'ttft_ms.p95 <= 500') or 'metric >= number' (e.g. 'goodput_rps >= 4')"
        )
    q = m.group("q")
    return Objective(
        metric=m.group("metric"),
        op=m.group("op"),
        threshold=float(m.group("value")),
        percentile=float(q) if q is not None else None,
        request_class=request_class,
    )


@dataclass(frozen=True)
class SLOSpec:
    """A parsed SLO file. ``request_limits`` (per class, ``None`` = every request) define good
    requests for goodput: completed ok with each per-request metric <= its limit."""

    objectives: tuple[Objective, ...]
    request_limits: Mapping[str | None, Mapping[str, float]] = field(default_factory=dict)
    min_requests: int = 10
    confidence: float = 0.95
    name: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not self.objectives:
            raise ValueError("an SLO needs at least one objective")
        at_least("min_requests", self.min_requests, 1)
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), e.g. 0.95; got {self.confidence}")

    def limits_for(self, request_class: str | None) -> Mapping[str, float]:
        """Per-request limits of a class (its own, else the file's global ones)."""
        if request_class is not None and request_class in self.request_limits:
            return self.request_limits[request_class]
        return self.request_limits.get(None, {})


def _derived_limits(objectives: Sequence[Objective]) -> dict[str, float]:
    """Per-request limits implied by percentile objectives: ``ttft_ms.p95 <= 500`` makes a
    request with TTFT over 500 ms not good. Several percentiles of one metric: the loosest."""
    out: dict[str, float] = {}
    for o in objectives:
        if o.upper_bound and o.metric in metrics.PER_REQUEST_METRICS:
            out[o.metric] = max(out.get(o.metric, o.threshold), o.threshold)
    return out


def _parse_limits(raw: Any, where: str) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a table of metric = limit_ms")
    out = {}
    for k, v in raw.items():
        if k not in metrics.PER_REQUEST_METRICS:
            known = ", ".join(sorted(metrics.PER_REQUEST_METRICS))
            raise ValueError(f"{where}: unknown per-request metric {k!r}; known: {known}")
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise ValueError(f"{where}.{k} must be a positive number of ms, got {v!r}")
        out[k] = float(v)
    return out


def _parse_objectives(raw: Any, where: str, cls: str | None) -> list[Objective]:
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ValueError(f'{where} must be a list of strings like ["ttft_ms.p95 <= 500"]')
    out = []
    for i, text in enumerate(raw):
        try:
            out.append(parse_objective(text, cls))
        except ValueError as exc:
            raise ValueError(f"{where}[{i}]: {exc}") from None
    return out


def parse_slo(data: Mapping[str, Any], source: str = "<slo>") -> SLOSpec:
    """An ``SLOSpec`` from parsed TOML; raises ``SLOError`` naming the source and the entry."""
    try:
        unknown = set(data) - _TOP_KEYS
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
        objectives = _parse_objectives(data.get("objectives", []), "objectives", None)
        limits: dict[str | None, Mapping[str, float]] = {}
        if "request" in data:
            limits[None] = _parse_limits(data["request"], "[request]")
        else:
            limits[None] = _derived_limits(objectives)
        classes = data.get("classes", {})
        if not isinstance(classes, Mapping):
            raise ValueError("[classes] must hold tables: [classes.NAME] objectives = [...]")
        for cls, body in classes.items():
            where = f"[classes.{cls}]"
            if not isinstance(body, Mapping) or set(body) - _CLASS_KEYS:
                raise ValueError(f"{where} may hold only {sorted(_CLASS_KEYS)}")
            own = _parse_objectives(body.get("objectives", []), f"{where}.objectives", cls)
            objectives.extend(own)
            if "request" in body:
                limits[cls] = _parse_limits(body["request"], f"{where}.request")
            elif _derived_limits(own):
                limits[cls] = {**limits[None], **_derived_limits(own)}
        min_requests = data.get("min_requests", 10)
        confidence = data.get("confidence", 0.95)
        if isinstance(min_requests, bool) or not isinstance(min_requests, int):
            raise ValueError(f"min_requests must be an integer, got {min_requests!r}")
        if isinstance(confidence, bool) or not isinstance(confidence, int | float):
            raise ValueError(f"confidence must be a number like 0.95, got {confidence!r}")
        if not objectives:
            raise ValueError('no objectives: add objectives = ["ttft_ms.p95 <= 500", ...]')
        return SLOSpec(
            objectives=tuple(objectives),
            request_limits=limits,
            min_requests=min_requests,
            confidence=float(confidence),
            name=str(data.get("name", "")),
            source=source,
        )
    except ValueError as exc:
        raise SLOError(f"{source}: {exc}") from None


def load_slo(path: str | Path) -> SLOSpec:
    """Read and validate an SLO file (TOML)."""
    p = Path(path)
    return parse_slo(read_toml(p, SLOError, "SLO file"), source=str(p))
