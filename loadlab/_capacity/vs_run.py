"""A results file's capacity section: its measured TTFT and TPOT beside the roofline's.

The model and hardware behind an endpoint must be known: for the reference server they come
from ``GET /v1/server_info`` (``--url``) or the results file's ``extra["server_info"]``; for
any other endpoint, declare them (``--model llama-3-8b --hardware h100``). Then, over the ok
requests of the measurement window:

- TTFT by prompt length (median per prompt-token count) against the predicted prefill time
  (TTFT also holds queueing and HTTP time, so the ratio is an upper bound of the miss);
- TPOT (median) against the predicted decode step at the run's batch: the closed-loop
  concurrency, or Little's law (completed requests/s x mean E2E) in open loop, with the
  context at the mean prompt plus half the output.

Example::

    rows = compare_run(read_results("reports/run.json"), get_model("ref-cpu"), hw)
    print(format_run_table(rows))
"""

from __future__ import annotations

import json
import statistics
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from loadlab._analysis import metrics
from loadlab._capacity import roofline
from loadlab._capacity.hardware import Hardware
from loadlab._capacity.models import DTYPE_BYTES, ModelSpec, get_model
from loadlab.errors import ConfigError
from loadlab.results import Results

__all__ = ["RunRow", "compare_run", "fetch_server_info", "format_run_table", "model_from_info"]


@dataclass(frozen=True)
class RunRow:
    what: str  # "ttft" | "tpot"
    size: int  # prompt tokens (ttft) or batch (tpot)
    n: int  # requests behind the median
    measured_ms: float
    predicted_ms: float
    cached: int = 0  # ttft: prompt tokens the server served from its prefix cache

    @property
    def ratio(self) -> float:
        return self.predicted_ms / self.measured_ms


def fetch_server_info(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """``GET <url>/v1/server_info`` of a reference server (preset, dtype, device, ...)."""
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url must start with http:// or https://, got {url!r}")
    with urllib.request.urlopen(url.rstrip("/") + "/v1/server_info", timeout=timeout_s) as r:  # noqa: S310
        return dict(json.loads(r.read()))


def model_from_info(info: dict[str, Any]) -> ModelSpec:
    """The reference preset named by a server_info document, in its dtype."""
    if "preset" not in info:
        raise ConfigError("server_info has no 'preset'; declare --model instead")
    dtype = DTYPE_BYTES.get(str(info.get("dtype", "float32")), 4)
    return get_model(f"ref-{info['preset']}", dtype)


def compare_run(results: Results, model: ModelSpec, hw: Hardware) -> list[RunRow]:
    lat = metrics.latency_records(results.records, results.measurement_window_ns())
    if not lat:
        raise ConfigError("the results file has no ok request in its window to compare")
    # By prompt length and cached tokens: a prefix-cache hit prefills only the rest.
    by_prompt: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in lat:
        p = r.prompt_tokens or r.prompt_tokens_requested
        ttft = metrics.ttft_ms(r)
        if p and ttft is not None:
            cached = min(r.cached_prompt_tokens or 0, int(p) - 1)
            by_prompt[(int(p), cached)].append(ttft)
    rows = [
        RunRow(
            "ttft",
            p,
            len(v),
            statistics.median(v),
            roofline.prefill(model, hw, p, cached_tokens=c).time_s * 1e3,
            cached=c,
        )
        for (p, c), v in sorted(by_prompt.items())
    ]
    tpots = [t for t in map(metrics.tpot_ms, lat) if t is not None]
    if tpots:
        conc = results.config.get("concurrency")
        if not conc:
            rps = metrics.throughput(lat, results.measurement_window_ns()).requests_per_s
            e2e = [e for e in map(metrics.e2e_ms, lat) if e is not None]
            conc = max(1, round(rps * statistics.mean(e2e) / 1e3))  # Little's law
        prompt = statistics.mean([r.prompt_tokens or r.prompt_tokens_requested or 0 for r in lat])
        out = statistics.mean([metrics.output_token_count(r) for r in lat])
        step = roofline.decode_step(model, hw, int(conc), int(prompt + out / 2))
        rows.append(
            RunRow("tpot", int(conc), len(tpots), statistics.median(tpots), step.time_s * 1e3)
        )
    return rows


def format_run_table(rows: list[RunRow], model: ModelSpec, hw: Hardware) -> str:
    lines = [
        f"capacity section: {model.name} on {hw.name} (roofline estimate vs this run; medians)",
        f"{'metric':<8}{'at':>22}{'n':>6}{'measured ms':>13}{'predicted ms':>14}{'ratio':>8}",
    ]
    for r in rows:
        at = f"{r.size} prompt tok" if r.what == "ttft" else f"batch {r.size}"
        if r.cached:
            at = f"{r.size} tok, {r.cached} cached"
        lines.append(
            f"{r.what:<8}{at:>22}{r.n:>6}{r.measured_ms:>13.1f}{r.predicted_ms:>14.1f}{r.ratio:>8.2f}"
        )
    lines.append("TTFT also holds queueing and HTTP time: its ratio bounds the prefill miss.")
    return "\n".join(lines)
