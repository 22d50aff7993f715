"""``RunConfig``: every knob of a run, shared by the CLI flags and the scenario files.

``loadlab run --scenario scenarios/chat.toml --rate 4`` reads the file into a ``RunConfig`` and
then applies the flags that were given on the command line (flags win). A scenario file's
top-level keys are these field names; ``[workload]`` is passed to
``loadlab.workloads.build_requests`` and interpreted there (kind = "synthetic" | "chat" |
"batch" | "trace", with that kind's parameters). ``[[endpoints]]`` lists named endpoints for a
side-by-side run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loadlab.errors import ConfigError

__all__ = ["EndpointConfig", "RunConfig"]

APIS = ("chat", "completions", "anthropic", "responses")


@dataclass(frozen=True)
class EndpointConfig:
    """One endpoint. ``api_key_env`` names the environment variable that holds the key."""

    url: str
    name: str = "default"
    model: str = "loadlab-ref"
    api: str = "chat"
    api_key_env: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ConfigError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"endpoint URL must start with http:// or https://, got {self.url!r}")


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
    seed: int = 0
    workers: int = 1  # processes on this machine
    workload: Mapping[str, Any] = field(default_factory=lambda: {"kind": "synthetic"})
    out: str | None = None  # results file; default reports/<timestamp>.json
    slo: str | None = None  # SLO file; the run's exit code follows the verdict
    scrape: str | None = None  # Prometheus /metrics URL to sample during the run
    scrape_interval_s: float = 1.0
    interleave: bool = False  # several endpoints: interleave requests instead of one after another
    progress: bool = True
    saturation_lag_ms: float = 20.0  # event-loop lag past which the generator is saturated

    def __post_init__(self) -> None:
        if (self.rate_rps is None) == (self.concurrency is None):
            raise ConfigError(
                "give exactly one of --rate (open loop, requests/s) or --concurrency (closed loop)"
            )
        if self.rate_rps is not None and not self.rate_rps > 0:
            raise ConfigError(
                f"--rate must be > 0, got {self.rate_rps}; for closed loop use --concurrency"
            )
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.duration_s is None and self.requests is None:
            raise ConfigError(
                "give --duration SECONDS or --requests N (or both) so the run can stop"
            )
        if self.duration_s is not None and not self.duration_s > 0:
            raise ConfigError(f"--duration must be > 0 seconds, got {self.duration_s}")
        if self.requests is not None and self.requests < 1:
            raise ConfigError(f"--requests must be >= 1, got {self.requests}")
        if self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.prompt_tokens < 1 or self.max_tokens < 1:
            raise ConfigError("--prompt-tokens and --max-tokens must be >= 1")
        if self.transport not in ("raw", "aiohttp"):
            raise ConfigError(f"--transport must be raw or aiohttp, got {self.transport!r}")
        if self.warmup_s < 0 or self.cooldown_s < 0:
            raise ConfigError("--warmup and --cooldown must be >= 0 seconds")

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the results file (API keys are never in a RunConfig, only var names)."""
        return dataclasses.asdict(self)
