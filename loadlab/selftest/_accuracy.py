"""The self-test: how exactly does this machine's loadlab measure a stream?

A fixed-schedule server (``loadlab.selftest._fixed_server``, its own process) writes each
request's first token ``ttft_ms`` after it arrived and the next ones ``itl_ms`` apart, and logs
``perf_counter_ns`` just before it hands each chunk to the socket (a non-blocking write of
microseconds; stamping first can only make loadlab's error look larger). ``perf_counter_ns`` is
CLOCK_MONOTONIC, one clock for both processes, so loadlab's records and the server's log compare
directly. The server's *write times* are the truth, not its intended schedule.

Per request, with ``sent`` loadlab's send time, ``w_k`` the server's write time and ``r_k``
loadlab's read time of token chunk k::

    true TTFT       = w_0 - sent            (what a perfect client reading at once would report)
    TTFT error      = reported TTFT - true TTFT = r_0 - w_0
    ITL error       = (r_k+1 - r_k) - (w_k+1 - w_k) for every gap, and
                      p99(reported ITL) - p99(true ITL) for the tail users gate on
    send delay      = server receive time - sent (reported beside; not part of the error, as
                      it is real latency any client pays: connect, kernel, server accept)
    output tokens/s = loadlab's reported figure over its window vs the server's written tokens
                      over the same span ending at the last write

A load level is *within tolerance* when TTFT error p99 <= ``ttft_tol_ms``, ITL p99 error
<= ``itl_tol_ms``, tokens/s within ``tps_tol``, every request ok and the generator not saturated.

Example::

    results = run_selftest(PRESETS["quick"])
    print(render_levels(results.extra["levels"]))
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from loadlab._analysis.generator import generator_parts
from loadlab._analysis.metrics import distribution, itl_ms, throughput
from loadlab._lab.machine import MachineWatch, busy_reasons
from loadlab._runner.run import run_specs
from loadlab.config import EndpointConfig, RunConfig
from loadlab.errors import ConfigError
from loadlab.records import RequestRecord, RequestSpec
from loadlab.results import Results, environment_info

__all__ = [
    "PRESETS",
    "PRESET_ALIASES",
    "SelftestConfig",
    "compare_level",
    "preset_name",
    "render_levels",
    "run_selftest",
]

NS_PER_MS = 1e6


@dataclass(frozen=True)
class SelftestConfig:
    levels: tuple[int, ...] = (1, 16, 64, 128, 256)  # concurrent streams, closed loop
    requests_per_stream: int = 4  # requests per level = streams x this
    ttft_ms: float = 50.0
    itl_ms: float = 10.0
    tokens: int = 64
    prompt_tokens: int = 16
    workers: int = 1
    ttft_tol_ms: float = 2.0  # on the TTFT error p99
    itl_tol_ms: float | None = 0.5  # on reported ITL p99 - true ITL p99 (None: not judged)
    tps_tol: float = 0.01  # relative, on output tokens/s
    min_server_tps: float | None = None  # a preset's acceptance bar on what the server reached
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.levels or min(self.levels) < 1:
            raise ConfigError("levels must be one or more stream counts >= 1, e.g. 1,16,64")
        if self.requests_per_stream < 1 or self.tokens < 1:
            raise ConfigError("--requests-per-stream and --tokens must be >= 1")
        if self.ttft_ms < 0 or self.itl_ms < 0:
            raise ConfigError("--ttft-ms and --itl-ms must be >= 0")
        if self.workers < 1 or self.workers > min(self.levels):
            raise ConfigError(
                f"--workers must be between 1 and the smallest level {min(self.levels)}"
            )


PRESETS: dict[str, SelftestConfig] = {
    "default": SelftestConfig(),
    "quick": SelftestConfig(levels=(1, 8, 32), requests_per_stream=3, tokens=32),
    # 64 streams at a chat-like pace, and 256 fast streams: the loads docs/benchmarks.md quotes
    "streams64": SelftestConfig(
        levels=(64,), requests_per_stream=10, ttft_ms=100.0, itl_ms=20.0, tokens=64
    ),
    "streams256": SelftestConfig(
        levels=(256,),
        requests_per_stream=10,
        ttft_ms=50.0,
        itl_ms=5.0,
        tokens=128,
        # 44k tokens/s is about a core of reading (most of it the kernel's recv and ACK
        # work): one process falls behind in parsing (flagged saturated), two keep up
        # (docs/harness.md); --workers 1 runs one
        workers=2,
        ttft_tol_ms=10.0,
        itl_tol_ms=None,
        min_server_tps=35_000.0,
    ),
}
# Earlier names of the two presets, still accepted on the command line (not listed in its help).
PRESET_ALIASES: dict[str, str] = {"issue64": "streams64", "issue256": "streams256"}


def preset_name(name: str) -> str:
    """The preset a ``--preset`` value names, earlier names included."""
    return PRESET_ALIASES.get(name, name)


def _pcts(values: list[float]) -> dict[str, float | None]:
    """p50, p90, p99 and max, the selftest's columns (``metrics.distribution``)."""
    d = distribution(values, (50.0, 90.0, 99.0))
    return {"p50": d.at(50), "p90": d.at(90), "p99": d.at(99), "max": d.max}


def compare_level(
    results: Results, truth: Mapping[str, Mapping[str, Any]], t0_ns: int
) -> dict[str, Any]:
    """Timing error of one level's records against the server's write log (absolute ns)."""
    ttft_err: list[float] = []
    ttft_rep: list[float] = []
    ttft_true: list[float] = []
    gap_err: list[float] = []
    itl_rep: list[float] = []
    itl_true: list[float] = []
    send_delay: list[float] = []
    mismatched = 0
    written = 0
    last_write = 0
    first_recv: int | None = None
    for entry in truth.values():
        written += len(entry["chunk_ns"])
        if entry["chunk_ns"]:
            last_write = max(last_write, int(entry["chunk_ns"][-1]))
        first_recv = min(first_recv or entry["recv_ns"], entry["recv_ns"])
    ok = [r for r in results.records if r.ok]
    for r in ok:
        t = truth.get(r.request_id)
        if t is None or r.sent_ns is None or len(t["chunk_ns"]) != len(r.chunk_ns):
            mismatched += 1
            continue
        sent = t0_ns + r.sent_ns
        reads = [t0_ns + c for c in r.chunk_ns]
        writes = [int(w) for w in t["chunk_ns"]]
        ttft_err.append((reads[0] - writes[0]) / NS_PER_MS)
        ttft_rep.append((reads[0] - sent) / NS_PER_MS)
        ttft_true.append((writes[0] - sent) / NS_PER_MS)
        send_delay.append((int(t["recv_ns"]) - sent) / NS_PER_MS)
        true_gaps = [(b - a) / NS_PER_MS for a, b in itertools.pairwise(writes)]
        rep_gaps = itl_ms(r)
        itl_true.extend(true_gaps)
        itl_rep.extend(rep_gaps)
        gap_err.extend(abs(x - y) for x, y in zip(rep_gaps, true_gaps, strict=True))
    window = results.measurement_window_ns()
    measured = throughput(results.records, window).output_tokens_per_s
    span_s = max((last_write - t0_ns - window[0]) / 1e9, 1e-9)
    truth_tps = written / span_s
    server_span_s = max((last_write - (first_recv or last_write)) / 1e9, 1e-9)
    rep, tru = _pcts(ttft_rep), _pcts(ttft_true)
    itl_rep_p99 = _pcts(itl_rep)["p99"]
    itl_true_p99 = _pcts(itl_true)["p99"]
    return {
        "requests": len(results.records),
        "ok": len(ok),
        "mismatched": mismatched,
        "ttft_err_ms": _pcts(ttft_err),
        "ttft_pct_diff_ms": {k: _diff(rep[k], tru[k]) for k in ("p50", "p90", "p99")},
        "ttft_true_ms": tru,
        "itl_p99_err_ms": (
            itl_rep_p99 - itl_true_p99
            if itl_rep_p99 is not None and itl_true_p99 is not None
            else None
        ),
        "itl_gap_err_ms": _pcts(gap_err),
        "send_delay_ms": _pcts(send_delay),
        "tps_measured": measured,
        "tps_truth": truth_tps,
        "tps_err_rel": (measured - truth_tps) / truth_tps if truth_tps else None,
        "server_tps": written / server_span_s,
        "saturated": results.saturated,
        "loop_lag_ms_p99": max(
            (float(p.get("loop_lag_ms_p99") or 0.0) for p in _parts(results)), default=None
        ),
        "parse_backlog_ms": {
            k: max(
                (float(p.get(f"parse_backlog_ms_{k}") or 0.0) for p in _parts(results)), default=0.0
            )
            for k in ("p50", "p99", "max")
        },
        "cpu_percent_mean": sum(float(p.get("cpu_percent_mean") or 0.0) for p in _parts(results)),
        # loadlab's own CPU time (all worker processes) per output token read
        "cpu_us_per_token": 1e6 * _cpu_s(results) / max(sum(len(r.chunk_ns) for r in ok), 1),
    }


def _parts(results: Results) -> list[Mapping[str, Any]]:
    return generator_parts(results.generator)


def _cpu_s(results: Results) -> float:
    return float(sum(float(p.get("cpu_s") or 0.0) for p in _parts(results)))


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def judge(level: Mapping[str, Any], sc: SelftestConfig) -> bool:
    """Is this level measured within the tolerances of ``sc``?"""
    err = level["ttft_err_ms"]
    checks = [
        level["ok"] == level["requests"] and level["mismatched"] == 0,
        err["p99"] is not None and err["p99"] <= sc.ttft_tol_ms,
        sc.itl_tol_ms is None
        or (level["itl_p99_err_ms"] is not None and abs(level["itl_p99_err_ms"]) <= sc.itl_tol_ms),
        level["tps_err_rel"] is not None and abs(level["tps_err_rel"]) <= sc.tps_tol,
        not level["saturated"],
    ]
    if sc.min_server_tps is not None:
        checks.append(level["server_tps"] >= sc.min_server_tps)
    return all(checks)


def _http_json(url: str, method: str = "GET") -> Any:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)  # noqa: S310 - loopback URL built here
    with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - loopback URL built here
        body = resp.read()
    return json.loads(body) if body else None


def _specs(level: int, n: int, sc: SelftestConfig, _cfg: RunConfig) -> Iterator[RequestSpec]:
    prompt = "x" * sc.prompt_tokens
    for i in range(n):
        yield RequestSpec(
            f"L{level}-{i}",
            prompt,
            sc.tokens,
            prompt_tokens=sc.prompt_tokens,
            request_class=f"c{level}",
        )


def _shift(results: Results, delta_ns: int) -> None:
    """Re-base a level's record times onto the self-test's first t0."""
    for r in results.records:
        for name in ("intended_ns", "sent_ns", "headers_ns", "end_ns"):
            v = getattr(r, name)
            if v is not None:
                setattr(r, name, v + delta_ns)
        r.chunk_ns = [c + delta_ns for c in r.chunk_ns]


def run_selftest(sc: SelftestConfig, say: Callable[[str], None] = print) -> Results:
    """Start the fixed server, drive it at each level, return one ``selftest`` results file."""
    from loadlab.selftest._fixed_server import FixedServerProcess

    levels: list[dict[str, Any]] = []
    records: list[RequestRecord] = []
    truth_all: dict[str, Any] = {}
    base_t0: int | None = None
    with FixedServerProcess(ttft_ms=sc.ttft_ms, itl_ms=sc.itl_ms, tokens=sc.tokens) as url:
        endpoint = EndpointConfig(url=url, name="fixed", model="loadlab-fixed")
        for level in sc.levels:
            n = level * sc.requests_per_stream
            cfg = RunConfig(
                endpoints=(endpoint,),
                concurrency=level,
                requests=n,
                prompt_tokens=sc.prompt_tokens,
                max_tokens=sc.tokens,
                workers=sc.workers,
                progress=False,
            )
            _http_json(f"{url}/truth/reset", "POST")
            say(f"selftest: {level} streams, {n} requests ...")
            watch = MachineWatch.start()  # this process, its server and its workers are "own"
            res = run_specs(cfg, endpoint, functools.partial(_specs, level, n, sc), kind="selftest")
            machine = watch.stop()
            truth = _http_json(f"{url}/truth")
            t0 = int(res.extra["t0_ns"])
            stats = {"streams": level, **compare_level(res, truth, t0)}
            stats["within_tolerance"] = judge(stats, sc)
            # what else took the CPU meanwhile (other processes, the hypervisor): figures measured
            # then are the machine's as much as loadlab's, and the table says so
            stats["machine"] = machine
            stats["busy"] = busy_reasons(machine, os.cpu_count() or 1)
            levels.append(stats)
            base_t0 = t0 if base_t0 is None else base_t0
            _shift(res, t0 - base_t0)
            records.extend(res.records)
            truth_all.update(
                {
                    rid: {
                        "recv_ns": int(t["recv_ns"]) - base_t0,
                        "chunk_ns": [int(c) - base_t0 for c in t["chunk_ns"]],
                    }
                    for rid, t in truth.items()
                }
            )
            last = res
    passing = [lv["streams"] for lv in levels if lv["within_tolerance"]]
    return Results(
        records=records,
        config={"selftest": {k: v for k, v in asdict(sc).items() if k != "extra"}},
        environment=environment_info(),
        started_at=last.started_at,
        duration_ns=max((r.end_ns or 0) for r in records) if records else 0,
        scheduled=len(records),
        workers=sc.workers,
        kind="selftest",
        generator={
            "saturated": any(lv["saturated"] for lv in levels),
            "loop_lag_ms_max": max(float(lv["loop_lag_ms_p99"] or 0.0) for lv in levels),
        },
        extra={
            "levels": levels,
            "highest_within_tolerance": max(passing) if passing else None,
            "truth": truth_all,
            "t0_ns": base_t0,
        },
    )


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def render_levels(levels: list[Mapping[str, Any]]) -> str:
    """The self-test table, one line per load level."""
    head = (
        f"{'streams':>7} {'reqs':>5}  {'TTFT err ms p50/p90/p99':>24}  {'ITL p99 err':>11}  "
        f"{'out tok/s meas / truth (err)':>31}  {'server tok/s':>12}  {'lag p99':>7}  "
        f"{'backlog p50/p99':>15}  {'cpu us/tok':>10}  ok?"
    )
    lines = [head]
    for lv in levels:
        e = lv["ttft_err_ms"]
        ttft = f"{_f(e['p50'])}/{_f(e['p90'])}/{_f(e['p99'])}"
        tps = (
            f"{lv['tps_measured']:,.0f} / {lv['tps_truth']:,.0f} "
            f"({_f(100 * (lv['tps_err_rel'] or 0.0), '{:+.2f}')}%)"
        )
        sat = " SATURATED" if lv["saturated"] else ""
        b = lv.get("parse_backlog_ms") or {}
        backlog = f"{_f(b.get('p50'), '{:.1f}')}/{_f(b.get('p99'), '{:.1f}')}"
        lines.append(
            f"{lv['streams']:>7} {lv['requests']:>5}  {ttft:>24}  {_f(lv['itl_p99_err_ms'], '{:+.3f}'):>11}  "
            f"{tps:>31}  {lv['server_tps']:>12,.0f}  {_f(lv['loop_lag_ms_p99'], '{:.1f}'):>7}  "
            f"{backlog:>15}  {_f(lv.get('cpu_us_per_token'), '{:.1f}'):>10}  "
            f"{'yes' if lv['within_tolerance'] else 'NO'}{sat}"
            + (f" (busy: {'; '.join(lv['busy'])})" if lv.get("busy") else "")
        )
    return "\n".join(lines)
