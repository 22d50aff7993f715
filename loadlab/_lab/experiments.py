"""The lab's experiments: the reference server's modes on the same seeded workload, in rounds.

The lab starts the reference server once per mode (static, continuous, chunked,
disaggregated) and then runs ``rounds`` rounds; each round visits every mode once, in an order
that rotates from round to round (``round_orders``), so a slow spell of other work on the
machine touches every mode alike. In its turn a mode runs:

    <out>/<mode>-batch-r<k>.json          a batch job: N documents submitted at once
                                           (``batch_modes`` only: static and continuous)
    <out>/<mode>-interference-r<k>.json   steady chat streams + long prompts arriving
    <out>/<mode>-baseline-r<k>.json       the same streams, no long prompts

plus ``<out>/batching.json`` (decode and prefill tokens/s against batch size, in rounds too,
measured on the model runner in a subprocess) and the report (``lab.md``, ``lab.html``,
``lab.json``; see ``loadlab._lab.summary``). Each results file carries in ``extra["lab"]`` the
round, the server's ``/v1/server_info``, the change of its ``/metrics`` counters and what the
machine was doing meanwhile (``loadlab._lab.machine.MachineWatch``).

The load generator (this process), each server and the disaggregated worker pools are pinned
to cores of their own where the machine has them (``loadlab._lab.machine.plan_placement``);
the placement, read back from the OS, is in ``LabOutcome.machine["placement"]``.

Example::

    outcome = run_lab(settings_for("tiny"), ["continuous", "chunked"], Path("reports/lab"))
    print(outcome.paths["chunked"]["interference"][0])   # reports/lab/chunked-interference-r1.json
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

from loadlab._analysis.server_metrics import parse_prometheus_text
from loadlab._lab.batchjob import job_lengths
from loadlab._lab.machine import MachineWatch, Placement, pin, placement_report, plan_placement
from loadlab._lab.settings import ALL_MODES, LabSettings
from loadlab._runner.endpoint import run_endpoint
from loadlab._runner.run import Prepared, prepare
from loadlab._runner.runner import run_async
from loadlab.config import EndpointConfig, RunConfig
from loadlab.errors import ConfigError
from loadlab.records import RequestSpec
from loadlab.results import Results, merge_results, write_results

__all__ = [
    "EXPERIMENTS",
    "LabOutcome",
    "available_modes",
    "counter_deltas",
    "experiment_configs",
    "experiments_of",
    "round_orders",
    "run_lab",
]

EXPERIMENTS = ("batch", "interference", "baseline")
Log = Callable[[str], None]


@dataclass
class LabOutcome:
    """What a lab run produced: results per (mode, experiment), one per round in order;
    skipped modes and why; the batching rounds; the machine and the placement."""

    results: dict[str, dict[str, list[Results]]] = field(default_factory=dict)
    paths: dict[str, dict[str, list[Path]]] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    batching: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)  # cores, load, placement


def round_orders(modes: list[str], rounds: int) -> list[list[str]]:
    """Each round's order of the modes: rotated by one each round.

    >>> round_orders(["a", "b", "c"], 4)
    [['a', 'b', 'c'], ['b', 'c', 'a'], ['c', 'a', 'b'], ['a', 'b', 'c']]
    """
    n = len(modes)
    return [modes[r % n :] + modes[: r % n] for r in range(rounds)] if n else []


def experiments_of(s: LabSettings, mode: str) -> list[str]:
    """The experiments a mode runs in its turn (the batch job only in ``s.batch_modes``)."""
    return [e for e in EXPERIMENTS if e != "batch" or mode in s.batch_modes]


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
        wl = {
            "kind": "batch",
            "documents": s.batch_documents,
            "submit": "at_once",
            "prompt_tokens": s.batch_prompt_tokens,
            "output_tokens": 1,  # each document's own length replaces it (batch_specs)
            "exact_output": True,
        }
        return [
            _cfg(
                s, url, rate_rps=1.0, requests=s.batch_documents, workload=wl,
                scrape=url + "/metrics", scrape_interval_s=1.0,
            )
        ]  # fmt: skip
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


def _specs(cfg: RunConfig, offset_s: float, prepared: Prepared) -> Iterator[RequestSpec]:
    for spec in prepared.build(cfg):
        if offset_s and spec.intended_at_s is not None:
            spec = dataclasses.replace(spec, intended_at_s=spec.intended_at_s + offset_s)
        yield spec


def batch_specs(cfg: RunConfig, lengths: list[int], prepared: Prepared) -> list[RequestSpec]:
    """The batch job's documents, each asking for exactly its own answer length."""
    specs = list(prepared.build(cfg))
    return [
        dataclasses.replace(
            spec, max_tokens=n, extra_body={**spec.extra_body, "min_tokens": n, "ignore_eos": True}
        )
        for spec, n in zip(specs, lengths, strict=True)
    ]


async def _run_parts(
    parts_in: list[tuple[RunConfig, Iterator[RequestSpec]]], prepared: Prepared
) -> Results:
    t0 = time.perf_counter_ns() + 50_000_000  # every part waits for the same start
    parts = [
        run_endpoint(
            cfg, prepared.endpoint, specs, t0_ns=t0, scrape=i == 0, token_ends=prepared.token_ends
        )
        for i, (cfg, specs) in enumerate(parts_in)
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
    """``after - before`` of every counter (``*_total``, ``*_sum``, ``*_count``, histogram
    ``*_bucket``) in both.

    >>> counter_deltas({"a_total": 1.0, "g": 5.0}, {"a_total": 4.0, "g": 2.0})
    {'a_total': 3.0}
    """
    out = {}
    for key, value in after.items():
        name = key.split("{", 1)[0]
        if name.endswith(("_total", "_sum", "_count", "_bucket")) and key in before:
            out[key] = value - before[key]
    return out


def _run_experiment(s: LabSettings, url: str, mode: str, experiment: str, round_no: int) -> Results:
    cfgs = experiment_configs(s, url, experiment)
    prepared = prepare(cfgs[0], cfgs[0].endpoints[0])  # the parts share one endpoint
    if experiment == "batch":
        parts = [(cfgs[0], iter(batch_specs(cfgs[0], job_lengths(s), prepared)))]
    else:
        offsets = [0.0, s.long_first_s][: len(cfgs)]
        parts = [(c, _specs(c, off, prepared)) for c, off in zip(cfgs, offsets, strict=True)]
    watch = MachineWatch.start()
    before = _counters(url)
    results = run_async(_run_parts(parts, prepared))
    after = _counters(url)
    machine = watch.stop()
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
        "round": round_no,
        "server_info": info,
        "server_deltas": counter_deltas(before, after),
        "machine": machine,
    }
    return results


# ---------------------------------------------------------------- the lab


def _batching(
    s: LabSettings, out_dir: Path, log: Log, cpus: tuple[int, ...] = ()
) -> dict[str, Any]:
    """The batching experiment in its own process (torch threads and memory stay there),
    pinned to ``cpus`` (the server's core: where a server's decode steps run)."""
    log(f"batching experiment: decode and prefill tokens/s against batch size, {s.rounds} rounds")
    cmd = [sys.executable, "-m", "loadlab._lab.batching", json.dumps(s.to_dict())]
    root = Path(__file__).resolve().parents[2]  # the checkout: loadlab/_lab/ -> ..
    proc = subprocess.Popen(  # noqa: S603 (our own interpreter and module)
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root
    )
    pin(proc.pid, cpus)
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": "the batching experiment took over 600 s"}
    if proc.returncode != 0:
        return {"error": (err.strip().splitlines() or ["failed"])[-1][:300]}
    data: dict[str, Any] = json.loads(out)
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
    """Run every experiment in every mode, ``s.rounds`` times, write the results files,
    return what happened.

    Every server is started at once (their start-up, mostly importing torch, overlaps; an
    idle server sleeps) and stays up through the rounds. The batching experiment runs first,
    alone, unless ``overlap_batching`` (``--quick``: speed over precision) runs it while the
    servers start. This process is pinned to the load generator's core while it runs.
    """
    from concurrent.futures import ThreadPoolExecutor

    t_start = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    cpus = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
    plan = plan_placement(cpus, s.threads)
    outcome = LabOutcome(machine={"cpus": len(cpus) or os.cpu_count(), "load_avg_start": _load()})
    avail = available_modes()
    for mode in modes:
        if avail.get(mode):
            outcome.unavailable[mode] = avail[mode]
            log(f"{mode}: skipped ({avail[mode]})")
    runnable = [m for m in modes if m not in outcome.unavailable]
    pin(0, plan.generator)
    pool = ThreadPoolExecutor(max_workers=1)
    servers: dict[str, Any] = {}
    try:
        batching = (
            pool.submit(_batching, s, out_dir, log, plan.server) if overlap_batching else None
        )
        if batching is None:
            outcome.batching = _batching(s, out_dir, log, plan.server)
        servers = _start_servers(s, runnable, plan, out_dir, outcome, log)
        if batching is not None:
            outcome.batching = batching.result()
        outcome.machine["placement"] = placement_report(
            {"load generator (loadlab lab)": os.getpid()}, children=False
        ) | placement_report({f"{m} server": srv.process.pid for m, srv in servers.items()})
        for r, order in enumerate(round_orders(list(servers), s.rounds), start=1):
            log(f"round {r} of {s.rounds}: {', '.join(order)}")
            for mode in order:
                _run_mode(s, mode, servers[mode].url, r, out_dir, outcome, log)
    finally:
        pool.shutdown()
        for server in servers.values():
            server.stop()
        pin(0, cpus)
    outcome.elapsed_s = time.perf_counter() - t_start
    outcome.machine["load_avg_end"] = _load()
    return outcome


def _start_servers(
    s: LabSettings, modes: list[str], plan: Placement, out_dir: Path, outcome: LabOutcome,
    log: Log,
) -> dict[str, Any]:  # fmt: skip
    """Start a server per mode (pinned), wait for each; a mode whose server fails is skipped."""
    from reference_server.launch import RunningServer

    started = {}
    for mode in modes:
        log(f"{mode}: starting the reference server (preset {s.preset}) ...")
        srv = RunningServer(
            mode, s.preset, extra_args=s.server_args(mode, plan),
            log_path=out_dir / f"{mode}-server.log",
        )  # fmt: skip
        pin(srv.process.pid, plan.api if mode == "disaggregated" else plan.server)
        started[mode] = srv
    ready = {}
    for mode, srv in started.items():
        try:
            ready[mode] = srv.wait_ready(s.server_timeout_s)
        except (RuntimeError, TimeoutError) as exc:
            outcome.unavailable[mode] = f"the server did not start: {exc}"
            log(f"{mode}: {outcome.unavailable[mode]}")
            srv.stop()
    return ready


def _load() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages: a shared machine's figures need them."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _run_mode(
    s: LabSettings, mode: str, url: str, round_no: int, out_dir: Path, outcome: LabOutcome,
    log: Log,
) -> None:  # fmt: skip
    for exp in experiments_of(s, mode):
        t = time.perf_counter()
        res = _run_experiment(s, url, mode, exp, round_no)
        path = write_results(res, out_dir / f"{mode}-{exp}-r{round_no}.json")
        outcome.results.setdefault(mode, {}).setdefault(exp, []).append(res)
        outcome.paths.setdefault(mode, {}).setdefault(exp, []).append(path)
        load = res.extra["lab"]["machine"]
        log(
            f"{mode}: {exp} done in {time.perf_counter() - t:.0f} s "
            f"(others {load['others_cores']:.2f} cores, steal {load['steal_share']:.0%}) -> {path}"
        )
