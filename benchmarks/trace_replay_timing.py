"""Open-loop schedule under big prompts: the Azure code trace replayed against a server that
stamps each request's arrival with the kernel's clock.

Starts the fixed-schedule server (``python -m loadlab.selftest``, its own process: it logs
``perf_counter_ns``, CLOCK_MONOTONIC, when each whole request had arrived), optionally a
process that burns one core (``--burn``), then runs the user-facing command::

    loadlab run --scenario <trace scenario> --endpoint URL --model m --out FILE

on 20 minutes of the Azure 2023 code trace at 60x (3,628 requests in 20 s, prompts up to
7,437 tokens) and prints, per request, how far behind the trace the server saw it arrive::

    arrival lag = server recv_ns - (t0_ns + intended_ns)

as p50 / p99 / max (acceptance: p99 <= 2 ms alone, <= 5 ms beside the burner), next to
loadlab's own send lag (sent_ns - intended_ns), the requests it marked late, how many it had
to build when they were due, its saturation verdict, and the load average before and after.
The arrival lag includes the kernel's delivery and the server reading the whole body: the
server's own event loop, on the same two cores, can be late to that read. ``--wire`` also
captures the packets (``loadlab._wire.capture``, root or CAP_NET_RAW) and prints the lag of the
request's last byte on the wire, by the kernel's timestamp, which no process's loop can move::

    wire lag = kernel time of the request's last packet - (t0_ns + intended_ns)

Prompts: ``--tokenizer auto`` (the default, as ``loadlab run``'s) calibrates against this
server, which counts words, so about 5 characters per token: prompts up to about 37,000
characters, each fitted to its count. ``loadlab run`` then exits 1 (the server's word counts
are not the requested token counts); the script reads the results file all the same.

Usage::

    python3 benchmarks/trace_replay_timing.py                  # alone, the whole 20 s replay
    python3 benchmarks/trace_replay_timing.py --burn           # beside a one-core burner
    python3 benchmarks/trace_replay_timing.py --wire           # and the kernel's packet times
    python3 benchmarks/trace_replay_timing.py --trace-seconds 120   # a short slice (2 s)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadlab._analysis.metrics import distribution  # noqa: E402
from loadlab._lab.machine import pin_threads  # noqa: E402
from loadlab._wire.capture import Capture, check_capture  # noqa: E402
from loadlab._wire.http import read_exchanges  # noqa: E402
from loadlab.results import read_results  # noqa: E402
from loadlab.selftest import FixedServerProcess  # noqa: E402

BURN = "while True:\n    pass\n"  # one core, at the same priority as the rest


def scenario(args: argparse.Namespace) -> str:
    return "\n".join(
        [
            "rate_rps = 100.0  # open loop; the trace brings its own send times",
            "requests = 1000000",
            "stream = true",
            "include_usage = true",
            f"seed = {args.seed}",
            "",
            "[workload]",
            'kind = "trace"',
            f"trace = {json.dumps(args.trace)}",
            f"time_scale = {args.time_scale}",
            f"start_s = {args.start_s}",
            f"duration_s = {args.trace_seconds}",
            "",
        ]
    )


def pcts(values: list[float]) -> str:
    if not values:
        return "no values"
    d = distribution(values, (50.0, 99.0))
    return f"p50 {d.at(50):7.3f}  p99 {d.at(99):7.3f}  max {d.max:7.3f}"


def _ms(value: object) -> str:
    return f"{value:.3f} ms" if isinstance(value, float) else str(value)


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="azure-2023-code", help="a shipped trace's name or a file")
    p.add_argument("--time-scale", type=float, default=60.0)
    p.add_argument("--start-s", type=float, default=0.0, help="window start, trace seconds")
    p.add_argument("--trace-seconds", type=float, default=1200.0, help="window, trace seconds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tokenizer", default="auto",
                   help="loadlab run --tokenizer (auto: calibrated against this server, about "
                        "5 characters per token, every prompt fitted; none: 1 character)")  # fmt: skip
    p.add_argument("--ttft-ms", type=float, default=20.0, help="the server's time to first token")
    p.add_argument("--itl-ms", type=float, default=5.0, help="the server's gap between tokens")
    p.add_argument("--burn", action="store_true", help="beside a process that burns one core")
    p.add_argument("--extra", action="append", default=[], metavar="ARG",
                   help="another loadlab run argument (repeatable), e.g. --extra=--workers=2")  # fmt: skip
    p.add_argument("--pin", action="store_true",
                   help="the server's threads on the last CPU, loadlab run on the others")  # fmt: skip
    p.add_argument("--wire", action="store_true",
                   help="also capture the packets: the request's last byte by the kernel's clock")  # fmt: skip
    p.add_argument("--out", help="keep the results file here (default: a temporary file)")
    p.add_argument("--loadlab-root", default=str(ROOT),
                   help="run loadlab run from this checkout (compare versions on one server)")  # fmt: skip
    args = p.parse_args()

    burner = None
    wire: dict[str, int] = {}  # request id -> its last byte on the wire, perf_counter_ns
    if args.wire:
        check_capture(None)
    try:
        if args.burn:
            burner = subprocess.Popen([sys.executable, "-c", BURN])
            time.sleep(1.0)  # let the load average see it start
        server = FixedServerProcess(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms)
        with tempfile.TemporaryDirectory() as tmp, server as url:
            cpus = sorted(os.sched_getaffinity(0))
            pin_run = None
            if args.pin and len(cpus) >= 2 and server.proc is not None:
                pin_threads(server.proc.pid, {cpus[-1]})
                pin_run = set(cpus[:-1])
                print(f"pinned: the server (and a capture) on CPU {cpus[-1]}, loadlab run on "
                      f"{sorted(pin_run)}")  # fmt: skip
            scen = Path(tmp) / "trace.toml"
            scen.write_text(scenario(args))
            out = Path(args.out) if args.out else Path(tmp) / "results.json"
            cmd = [sys.executable, "-m", "loadlab", "run", "--scenario", str(scen),
                   "--endpoint", url, "--model", "m", "--tokenizer", args.tokenizer,
                   "--no-progress", "--out", str(out), *args.extra]  # fmt: skip
            before = loadavg()
            print(f"load average before: {before}{'  (burning one core)' if burner else ''}")
            print("running:", " ".join(cmd[2:]), flush=True)
            wall = time.perf_counter()
            env = {**os.environ, "PYTHONPATH": args.loadlab_root}
            port = int(url.rsplit(":", 1)[1])
            cap = Capture(port, None, Path(tmp) / "run.pcap") if args.wire else None
            with cap or contextlib.nullcontext():
                if cap is not None and cap.proc is not None and pin_run:
                    pin_threads(cap.proc.pid, {cpus[-1]})
                done = subprocess.run(
                    cmd, cwd=args.loadlab_root, env=env, check=False, capture_output=True,
                    text=True, preexec_fn=(lambda: os.sched_setaffinity(0, pin_run)) if pin_run else None,
                )  # fmt: skip
            wall = time.perf_counter() - wall
            if cap is not None:
                assert cap.result is not None and cap.clock is not None
                print(f"capture: {cap.result.packets} packets, {cap.result.dropped} dropped")
                _, exs = read_exchanges(cap.result.pcap, port)
                wire = {
                    ex.request_id: cap.clock.to_perf_ns(ex.request_last_ns)
                    for ex in exs
                    if ex.request_id is not None
                }
            after = loadavg()
            if done.returncode not in (0, 1):  # 1: prompt lengths off (this server counts words)
                print(f"loadlab run exited {done.returncode}:\n{done.stderr[-3000:]}")
                return 1
            truth = json.loads(urllib.request.urlopen(url + "/truth").read())  # noqa: S310
            res = read_results(out)
    finally:
        if burner is not None:
            burner.terminate()
            burner.wait()

    t0 = int(res.extra["t0_ns"])
    arrival, send, on_wire, missing = [], [], [], 0
    for r in res.records:
        if r.intended_ns is None or r.sent_ns is None:
            continue
        send.append((r.sent_ns - r.intended_ns) / 1e6)
        if r.request_id in wire:
            on_wire.append((wire[r.request_id] - t0 - r.intended_ns) / 1e6)
        t = truth.get(r.request_id)
        if t is None:
            missing += 1
            continue
        arrival.append((int(t["recv_ns"]) - t0 - r.intended_ns) / 1e6)
    outcomes: dict[str, int] = {}
    for r in res.records:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    gen = res.generator
    print(f"\n{len(res.records)} requests over {args.trace_seconds:g} s of trace at "
          f"{args.time_scale:g}x, outcomes {outcomes}, command wall {wall:.1f} s")  # fmt: skip
    print(f"arrival behind the trace, ms (server clock): {pcts(arrival)}")
    print(f"  over 2 ms: {sum(a > 2 for a in arrival)}, over 5 ms: {sum(a > 5 for a in arrival)}"
          f"{f', {missing} not seen by the server' if missing else ''}")  # fmt: skip
    if args.wire:
        print(f"wire lag, ms (kernel, last request byte):  {pcts(on_wire)}")
        print(f"  over 2 ms: {sum(a > 2 for a in on_wire)}, over 5 ms: "
              f"{sum(a > 5 for a in on_wire)}, {len(on_wire)} of {len(send)} found on the wire")  # fmt: skip
    print(f"send lag, ms (loadlab's sent_ns):           {pcts(send)}")
    late = sum(1 for r in res.records if r.late)
    print(f"marked late by loadlab: {late}; requests built when due: {gen.get('built_late')}; "
          f"generator saturated: {gen.get('saturated')}, loop lag p99 "
          f"{_ms(gen.get('loop_lag_ms_p99'))}, dispatch lag p99 {_ms(gen.get('dispatch_lag_ms_p99'))}")  # fmt: skip
    print(f"load average before {before}, after {after}"
          f"{'  (beside a one-core burner)' if args.burn else '  (alone)'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
