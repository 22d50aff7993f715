"""``RunConfig``: every knob of a run, with its default, for the CLI, the scenario files and
the Python API alike.

``loadlab run --scenario scenarios/chat.toml --rate 4`` reads the file into a ``RunConfig`` and
then applies the flags that were given on the command line (flags win); a flag that is not
given leaves the field's default below, which is also what ``--help`` shows. A scenario
file's top-level keys are these field names; ``[workload]`` is passed to
``loadlab.workloads.build_requests`` and interpreted there (kind = "synthetic" | "chat" |
"batch" | "trace" | ..., with that kind's parameters). ``[[endpoints]]`` lists named endpoints
for a side-by-side run. ``loadlab._runner.run`` runs one, whoever asks.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loadlab._headers import (
    check_header,
    check_no_proxy,
    check_url,
    public_url,
    redact_headers,
    split_userinfo,
)
from loadlab._limits import MAX_DURATION_S, MAX_TOKENS, MAX_WORKERS, machine_limits
from loadlab.errors import ConfigError, parse_json

__all__ = ["DEMO", "EndpointConfig", "RunConfig", "extra_body_from_flag"]

APIS = ("chat", "completions", "anthropic", "responses", "embeddings", "rerank", "score")
SEED_RANGE = 10**9  # a drawn seed is below it: short enough to type back as --seed

# ``loadlab run`` with no endpoint and no scenario (the README's first command): a short chat
# load against the embedded reference server, small enough to finish in about a minute on 2
# CPU cores, big enough to show percentiles. Fields given on the command line win.
DEMO: Mapping[str, Any] = {
    "concurrency": 4,
    "requests": 24,
    "duration_s": 45.0,  # a cap on a slow machine; 24 requests usually end it sooner
    "prompt_tokens": 64,
    "max_tokens": 32,
    "workload": {
        "kind": "chat",
        "turns": 2,
        "think_time_s": 0.5,
        "prompt_tokens": 64,
        "output_tokens": 32,
    },
}


@dataclass(frozen=True)
class EndpointConfig:
    """One endpoint. ``api_key_env`` names the environment variable that holds the key.

    User-info in ``url`` (``http://user:pass@host``) is moved at once into an
    ``Authorization: Basic`` header (unless ``headers`` has one), so the URL is safe to print
    and store and both transports send the credentials; every header is checked for CR, LF
    and NUL (``loadlab._headers``).
    """

    url: str
    name: str = "default"
    model: str = "loadlab-ref"
    api: str = "chat"
    api_key_env: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ConfigError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")
        check_url(self.url, "--endpoint")
        url, basic = split_userinfo(self.url)
        headers = dict(self.headers)
        if basic is not None and not any(k.lower() == "authorization" for k in headers):
            headers = {"Authorization": basic, **headers}
        for name, value in headers.items():
            check_header(name, value)
        object.__setattr__(self, "url", url)  # frozen: set once, before anyone reads it
        object.__setattr__(self, "headers", headers)


@dataclass(frozen=True)
class RunConfig:
    endpoints: tuple[EndpointConfig, ...] = ()  # empty: start the embedded reference server
    # load: exactly one of rate_rps (open loop) or concurrency (closed loop)
    rate_rps: float | None = None
    concurrency: int | None = None
    arrival: str = "poisson"  # constant | poisson | gamma (open loop)
    cv: float = 1.0  # gamma burstiness
    max_in_flight: int | None = None  # open loop cap; over it a request is dropped, not delayed
    # stop rules
    duration_s: float | None = None
    requests: int | None = None
    warmup_s: float = 0.0  # excluded from the measurement window at the start
    cooldown_s: float = 0.0  # excluded at the end (drain)
    # request shape (synthetic workload defaults; [workload] may override)
    prompt_tokens: int = 128
    max_tokens: int = 64
    stream: bool = True
    include_usage: bool = True
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    transport: str = "raw"  # "raw" (lowest overhead, exact read times) | "aiohttp" (proxies)
    timeout_s: float = 120.0  # whole request
    read_timeout_s: float = 30.0  # longest silence inside a stream
    # None: every run draws its own (``seeded``), recorded in its results file, so a run never
    # finds an earlier run's prompts in a server's prefix cache; give one to repeat a run
    seed: int | None = None
    workers: int = 1  # processes on this machine
    workload: Mapping[str, Any] = field(default_factory=lambda: {"kind": "synthetic"})
    # how prompts are made exactly their token count as each endpoint counts them: "auto"
    # (the endpoint's tokenizer route, else a calibration, else an estimate with a warning),
    # "server", "calibrate", a tokenizer folder, tokenizer.json, tiktoken file or cached model
    # id, "byte" (the reference server's), or "none" (a characters-per-token estimate); a
    # workload's ``chars_per_token`` also means an estimate (``loadlab._runner.prompt_sizing``)
    tokenizer: str = "auto"
    out: str | None = None  # results file; default reports/<timestamp>.json
    slo: str | None = None  # SLO file; the run's exit code follows the verdict
    scrape: str | None = None  # Prometheus /metrics URL to sample during the run
    scrape_interval_s: float = 1.0
    interleave: bool = False  # several endpoints: interleave requests instead of one after another
    progress: bool = True
    saturation_lag_ms: float = 20.0  # event-loop lag past which the generator is saturated
    max_event_bytes: int = 4 << 20  # longest SSE line, event or whole body; over: protocol_error
    redact_headers: tuple[str, ...] = ()  # header names stored as *** beyond credential-like ones
    # Cost and energy (docs/cost.md): price tables and GPU telemetry sources by endpoint name
    # ("*": every endpoint); a source is a DCGM exporter's URL or "nvml"
    pricing: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    gpu_metrics: Mapping[str, str] = field(default_factory=dict)
    gpu_interval_s: float = 1.0
    gpu_baseline_s: float = 5.0  # idle GPU samples before the first request
    # One run over several machines (docs/distributed.md): this process runs part K of N of
    # the schedule, starting at the wall-clock time ``start_at`` (Unix seconds) that all share
    shard: tuple[int, int] | None = None
    start_at: float | None = None

    def __post_init__(self) -> None:
        if (self.rate_rps is None) == (self.concurrency is None):
            raise ConfigError(
                "give exactly one of --rate (open loop, requests/s) or --concurrency (closed loop)"
            )
        if self.duration_s is None and self.requests is None:
            raise ConfigError(
                "give --duration SECONDS or --requests N (or both) so the run can stop"
            )
        if self.transport not in ("raw", "aiohttp"):
            raise ConfigError(f"--transport must be raw or aiohttp, got {self.transport!r}")
        if self.scrape:
            check_url(self.scrape, "--scrape")
        if self.transport == "raw":
            for endpoint in self.endpoints:
                check_no_proxy(endpoint.url)
        self._check_numbers()
        self._check_cost()

    def _check_cost(self) -> None:
        """Price tables valid (``loadlab._analysis.cost``), GPU sampling periods in range."""
        from loadlab._analysis.cost import check_tables

        check_tables(self.pricing, "pricing")
        _number("--gpu-interval", self.gpu_interval_s, 0.0, 3600.0, "s", "give seconds",
                open_lo=True)  # fmt: skip
        _number("--gpu-baseline", self.gpu_baseline_s, 0.0, 3600.0, "s", "give seconds")

    def _check_numbers(self) -> None:
        """Every number finite, of its type and within its range (``loadlab._limits``)."""
        lim = machine_limits()
        _integer("--workers", self.workers, 1, MAX_WORKERS, "fewer processes")
        if self.shard is not None:
            self._check_shard()
        if self.start_at is not None:
            _number("--start-at", self.start_at, 0, 1e11, "s", "Unix seconds, e.g. $(date +%s)")
        streams = lim.streams(self.workers)
        machine = (
            f"this machine: {lim.streams_per_process} open files per process x "
            f"{self.workers} worker(s), {lim.memory_bytes >> 20} MiB available"
        )
        fix = f"{machine}; raise `ulimit -n`, add --workers or ask for less"
        if self.rate_rps is not None:
            _number("--rate", self.rate_rps, 0.0, float(streams), "requests/s", fix, open_lo=True)
        if self.concurrency is not None:
            _integer("--concurrency", self.concurrency, 1, streams, fix)
        if self.max_in_flight is not None:
            _integer("--max-in-flight", self.max_in_flight, 1, streams, fix)
        _number("--cv", self.cv, 0.0, 100.0, "", "a gamma CV is about 0.1 to 10", open_lo=True)
        for flag, value in (
            ("--duration", self.duration_s),
            ("--timeout", self.timeout_s),
            ("--read-timeout", self.read_timeout_s),
        ):
            if value is not None:
                _number(flag, value, 0.0, MAX_DURATION_S, "s", "give seconds", open_lo=True)
        for flag, value in (("--warmup", self.warmup_s), ("--cooldown", self.cooldown_s)):
            _number(flag, value, 0.0, MAX_DURATION_S, "s", "give seconds")
        if self.duration_s is not None and self.warmup_s + self.cooldown_s >= self.duration_s:
            raise ConfigError(
                f"--warmup {self.warmup_s:g} s and --cooldown {self.cooldown_s:g} s leave no "
                f"measurement window in --duration {self.duration_s:g} s: make --duration longer "
                "than their sum"
            )
        _number(
            "--scrape-interval",
            self.scrape_interval_s,
            0.0,
            3600.0,
            "s",
            "give seconds",
            open_lo=True,
        )
        _number(
            "--saturation-lag-ms",
            self.saturation_lag_ms,
            0.0,
            MAX_DURATION_S * 1000.0,
            "ms",
            "the default is 20",
            open_lo=True,
        )
        most = lim.requests()
        mem_fix = f"{lim.memory_bytes >> 20} MiB available holds about {most} records"
        if self.requests is not None:
            _integer("--requests", self.requests, 1, most, mem_fix + "; run less per file")
        if self.rate_rps is not None and self.duration_s is not None and self.requests is None:
            planned = self.rate_rps * self.duration_s
            if planned > most:
                raise ConfigError(
                    f"--rate {self.rate_rps:g} for --duration {self.duration_s:g} s plans "
                    f"{planned:.3g} requests ({mem_fix}: lower --rate or --duration, or add "
                    "--requests N)"
                )
        _integer("--prompt-tokens", self.prompt_tokens, 1, MAX_TOKENS, "tokens per request")
        _integer("--max-tokens", self.max_tokens, 1, MAX_TOKENS, "tokens per request")
        if self.seed is not None:
            _integer("--seed", self.seed, 0, 2**63 - 1, "any non-negative integer")
        if not isinstance(self.tokenizer, str) or not self.tokenizer.strip():
            raise ConfigError(
                f"--tokenizer must name a tokenizer or a method (auto, server, calibrate, byte, "
                f"none), got {self.tokenizer!r}"
            )
        _integer("--max-event-bytes", self.max_event_bytes, 1024, 1 << 30, "the default is 4 MiB")

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    @property
    def request_seed(self) -> int:
        """The seed the requests are built from: ``seed``, or 0 for a config no run has seeded
        (a build outside a run, such as a simulation's or a test's, then repeats)."""
        return 0 if self.seed is None else int(self.seed)

    def seeded(self) -> RunConfig:
        """This config with its seed: the one given, else one drawn now (a fresh run)."""
        if self.seed is not None:
            return self
        return self.replace(seed=secrets.randbelow(SEED_RANGE))

    def _check_shard(self) -> None:
        k, n = self.shard  # type: ignore[misc]
        _integer("--shard N", n, 1, 100_000, "K/N: part K of N, counted from 0")
        _integer("--shard K", k, 0, int(n) - 1, f"K/N: K from 0 to {int(n) - 1}")
        if self.seed is None:
            raise ConfigError(
                "--shard needs --seed: every shard must draw the same schedule, and a run "
                "without --seed draws its own"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the results file: API keys are never in a RunConfig (only variable
        names), credential headers read ``***`` and URLs carry no user-info."""
        out = dataclasses.asdict(self)
        for ep in out["endpoints"]:
            ep["headers"] = redact_headers(ep["headers"], self.redact_headers)
        if self.scrape:
            out["scrape"] = public_url(self.scrape)
        out["gpu_metrics"] = {k: public_url(v) for k, v in self.gpu_metrics.items()}
        return out


def _integer(flag: str, value: object, lo: int, hi: int, fix: str) -> None:
    """``value`` must be an int (not a bool, not a float) in ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # numpy ints too
        raise ConfigError(f"{flag} must be a whole number, got {value!r} ({fix})")
    if not lo <= int(value) <= hi:
        raise ConfigError(f"{flag} must be between {lo} and {hi}, got {value} ({fix})")


def _number(
    flag: str, value: object, lo: float, hi: float, unit: str, fix: str, *, open_lo: bool = False
) -> None:
    """``value`` must be a finite real number in ``[lo, hi]`` (``(lo, hi]`` with ``open_lo``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{flag} must be a number, got {value!r} ({fix})")
    x = float(value)
    if not (math.isfinite(x) and (x > lo if open_lo else x >= lo) and x <= hi):
        low = f"> {lo:g}" if open_lo else f">= {lo:g}"
        raise ConfigError(
            f"{flag} must be a finite number {low} and <= {hi:g}{' ' + unit if unit else ''}, "
            f"got {value} ({fix})"
        )


def extra_body_from_flag(text: str) -> dict[str, Any]:
    """``--extra-body``'s JSON object; ``ConfigError`` saying what is wrong otherwise."""
    extra = parse_json(text, ConfigError, "--extra-body")
    if not isinstance(extra, dict):
        raise ConfigError("--extra-body must be a JSON object, e.g. '{\"ignore_eos\": true}'")
    return extra
