"""The lab's experiments: the reference server's modes on the same seeded workload.

For each mode (static, continuous, chunked, disaggregated) the lab starts the reference
server, runs three experiments against it and writes one results file per experiment:

    <out>/<mode>-interference.json   steady chat streams + a long prompt arriving periodically
    <out>/<mode>-baseline.json       the same streams, no long prompts
    <out>/<mode>-batch.json          a batch job: N documents submitted at once

plus ``<out>/batching.json`` (decode and prefill tokens/s against batch size, measured on the
model runner in a subprocess) and the report (``lab.md``, ``lab.html``, ``lab.json``; see
``loadlab.lab.summary``). Each results file carries the server's ``/v1/server_info`` and the
change of its ``/metrics`` counters over the experiment in ``extra["lab"]``.

Example::

    outcome = run_lab(settings_for("tiny"), ["continuous", "chunked"], Path("reports/lab"))
    print(outcome.paths["chunked"]["interference"])   # reports/lab/chunked-interference.json
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadlab.config import EndpointConfig, RunConfig
from loadlab.errors import ConfigError
from loadlab.lab.settings import ALL_MODES, LabSettings
from loadlab.records import RequestSpec
from loadlab.results import Results, merge_results, write_results
from loadlab.runner.runner import run_async
from loadlab.runner.workers import run_endpoint
from loadlab.scrape import parse_prometheus_text
from loadlab.workloads import build_requests

__all__ = [
    "EXPERIMENTS",
    "LabOutcome",
    "available_modes",
    "counter_deltas",
    "experiment_configs",
    "run_lab",
]

EXPERIMENTS = ("interference", "baseline", "batch")
Log = Callable[[str], None]


@dataclass
class LabOutcome:
    """What a lab run produced: results per (mode, experiment), skipped modes and why."""

    results: dict[str, dict[str, Results]] = field(default_factory=dict)
    paths: dict[str, dict[str, Path]] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    batching: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)  # cores, load before and after


def available_modes() -> dict[str, str]:
    """Every mode of the lab -> "" when the reference server has it, else why not."""
    from reference_server.scheduler import MODES

    out = {}
    for mode in ALL_MODES:
        if mode in MODES:
            out[mode] = ""
        elif mode == "disaggregated" and any(
            importlib.util.find_spec(m) is not None
            for m in (
                "reference_server.disaggregated",
                "reference_server.disagg",
                "reference_server.scheduler.disaggregated",
            )
        ):
            out[mode] = ""
        else:
            out[mode] = f"the reference server has no {mode!r} mode yet"
    return out


# ---------------------------------------------------------------- the workloads


def _cfg(s: LabSettings, url: str, **fields: Any) -> RunConfig:
    base: dict[str, Any] = {
        "endpoints": (EndpointConfig(url=url, name="reference"),),
        "seed": s.seed,
        "progress": False,
        "timeout_s": 600.0,  # a stalled stream on a busy CPU is data, not a failure
        "read_timeout_s": 300.0,
    }
    return RunConfig(**{**base, **fields})


def experiment_configs(s: LabSettings, url: str, experiment: str) -> list[RunConfig]:
    """The ``RunConfig`` of each part of an experiment (run together on one clock)."""
    chat = {
        "kind": "synthetic",
        "prompt_tokens": s.chat_prompt_tokens,
        "output_tokens": s.chat_output_tokens,
        "request_class": "chat",
        "exact_output": True,
    }
    scrape = {"scrape": url + "/metrics", "scrape_interval_s": 1.0}
    if experiment == "batch":
        out = {"dist": "uniform", "low": s.batch_output_min, "high": s.batch_output_max}
        wl = {
            "kind": "batch",
            "documents": s.batch_documents,
            "submit": "at_once",
            "prompt_tokens": s.batch_prompt_tokens,
            "output_tokens": out,
            "exact_output": True,
        }
        return [_cfg(s, url, rate_rps=1.0, requests=s.batch_documents, workload=wl, **scrape)]
    duration = s.duration_s if experiment == "interference" else s.baseline_s
    streams = _cfg(
        s,
        url,
        concurrency=s.streams,
        duration_s=duration,
        warmup_s=s.warmup_s,
        workload=chat,
        **scrape,
    )
    if experiment == "baseline":
        return [streams]
    if experiment != "interference":
        raise ConfigError(f"unknown experiment {experiment!r}; choose one of {EXPERIMENTS}")
    long = {
        "kind": "synthetic",
        "prompt_tokens": s.long_prompt_tokens,
        "output_tokens": s.long_output_tokens,
        "request_class": "long_prompt",
        "exact_output": True,
    }
    longs = _cfg(
        s,
        url,
        rate_rps=1.0 / s.long_every_s,
        arrival="constant",
        requests=s.long_prompts,
        duration_s=duration,
        warmup_s=s.warmup_s,
        workload=long,
    )
    return [streams, longs]


def _specs(cfg: RunConfig, offset_s: float) -> Iterator[RequestSpec]:
    for spec in build_requests(cfg):
        if offset_s and spec.intended_at_s is not None:
            spec = dataclasses.replace(spec, intended_at_s=spec.intended_at_s + offset_s)
        yield spec


async def _run_parts(cfgs: list[RunConfig], offsets: list[float]) -> Results:
    t0 = time.perf_counter_ns() + 50_000_000  # every part waits for the same start
    parts = [
        run_endpoint(cfg, cfg.endpoints[0], _specs(cfg, off), t0_ns=t0, scrape=i == 0)
        for i, (cfg, off) in enumerate(zip(cfgs, offsets, strict=True))
    ]
    done = list(await asyncio.gather(*parts))
    return done[0] if len(done) == 1 else merge_results(done)


# ---------------------------------------------------------------- the server's side


def _get(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (loopback URL we built)
        return str(resp.read().decode("utf-8", "replace"))


def _counters(url: str) -> dict[str, float]:
    try:
        return parse_prometheus_text(_get(url + "/metrics"))
    except OSError:
        return {}


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """``after - before`` of every counter (``*_total``, ``*_sum``, ``*_count``) in both.

    >>> counter_deltas({"a_total": 1.0, "g": 5.0}, {"a_total": 4.0, "g": 2.0})
    {'a_total': 3.0}
    """
    out = {}
    for key, value in after.items():
        name = key.split("{", 1)[0]
        if name.endswith(("_total", "_sum", "_count")) and key in before:
            out[key] = value - before[key]
    return out


def _run_experiment(s: LabSettings, url: str, mode: str, experiment: str) -> Results:
    cfgs = experiment_configs(s, url, experiment)
    offsets = [0.0, s.long_first_s][: len(cfgs)]
    before = _counters(url)
    results = run_async(_run_parts(cfgs, offsets))
    after = _counters(url)
    try:
        info = json.loads(_get(url + "/v1/server_info"))
    except (OSError, ValueError):
        info = {}
    results.kind = "lab"
    results.config = {
        "lab": {"mode": mode, "experiment": experiment, "settings": s.to_dict()},
        "parts": [c.to_dict() for c in cfgs],
    }
    results.extra["lab"] = {
        "mode": mode,
        "experiment": experiment,
        "server_info": info,
        "server_deltas": counter_deltas(before, after),
    }
    return results


# ---------------------------------------------------------------- the lab


def _batching(s: LabSettings, out_dir: Path, log: Log) -> dict[str, Any]:
    """The batching experiment in its own process (torch threads and memory stay there)."""
    log("batching experiment: decode and prefill tokens/s against batch size ...")
    cmd = [sys.executable, "-m", "loadlab.lab.batching", json.dumps(s.to_dict())]
    root = Path(__file__).resolve().parents[2]  # the checkout: loadlab/lab/ -> ..
    try:
        proc = subprocess.run(  # noqa: S603 (our own interpreter and module)
            cmd, capture_output=True, text=True, timeout=600, cwd=root, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": "the batching experiment took over 600 s"}
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    data: dict[str, Any] = json.loads(proc.stdout)
    (out_dir / "batching.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    return data


def run_lab(
    s: LabSettings,
    modes: list[str],
    out_dir: Path,
    log: Log = lambda line: print(line, file=sys.stderr),
    *,
    overlap_batching: bool = False,
) -> LabOutcome:
    """Run every experiment in every mode, write the results files, return what happened.

    Every server is started at once (their start-up, mostly importing torch, overlaps; an
    idle server sleeps) and each is stopped as soon as its mode is measured. The batching
    experiment runs first, alone, unless ``overlap_batching`` (``--quick``: speed over
    precision) runs it while the servers start.
    """
    from concurrent.futures import ThreadPoolExecutor

    from reference_server.launch import RunningServer

    t_start = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    outcome = LabOutcome(machine={"cpus": os.cpu_count(), "load_avg_start": _load()})
    avail = available_modes()
    for mode in modes:
        if avail.get(mode):
            outcome.unavailable[mode] = avail[mode]
            log(f"{mode}: skipped ({avail[mode]})")
    runnable = [m for m in modes if m not in outcome.unavailable]
    pool = ThreadPoolExecutor(max_workers=1)
    batching = pool.submit(_batching, s, out_dir, log) if overlap_batching else None
    if batching is None:
        outcome.batching = _batching(s, out_dir, log)
    servers: dict[str, RunningServer] = {}
    try:
        for mode in runnable:
            log(f"{mode}: starting the reference server (preset {s.preset}) ...")
            servers[mode] = RunningServer(
                mode,
                s.preset,
                extra_args=s.server_args(mode),
                log_path=out_dir / f"{mode}-server.log",
            )
        if batching is not None:
            outcome.batching = batching.result()
        for mode in runnable:
            _run_mode(s, mode, servers[mode], out_dir, outcome, log)
    finally:
        pool.shutdown()
        for server in servers.values():
            server.stop()
    outcome.elapsed_s = time.perf_counter() - t_start
    outcome.machine["load_avg_end"] = _load()
    return outcome


def _load() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages: a shared machine's figures need them."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _run_mode(
    s: LabSettings, mode: str, server: Any, out_dir: Path, outcome: LabOutcome, log: Log
) -> None:
    try:
        server.wait_ready(s.server_timeout_s)
    except (RuntimeError, TimeoutError) as exc:
        outcome.unavailable[mode] = f"the server did not start: {exc}"
        log(f"{mode}: {outcome.unavailable[mode]}")
        return
    try:
        for exp in EXPERIMENTS:
            t = time.perf_counter()
            res = _run_experiment(s, server.url, mode, exp)
            path = write_results(res, out_dir / f"{mode}-{exp}.json")
            outcome.results.setdefault(mode, {})[exp] = res
            outcome.paths.setdefault(mode, {})[exp] = path
            log(f"{mode}: {exp} done in {time.perf_counter() - t:.0f} s -> {path}")
    finally:
        server.stop()
