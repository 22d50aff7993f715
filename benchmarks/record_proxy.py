"""What ``loadlab record`` costs: the same load direct and through the proxy, alternating.

The fixed-schedule server (``python -m loadlab.selftest``) answers every request on a fixed
schedule (TTFT and ITL), so whatever loadlab measures beyond the direct run's figures is the
proxy's own cost: TTFT and ITL at p50 / p99, direct and via the proxy, at each stream count.
Runs alternate direct, proxy, proxy, direct (``--rounds`` times) so a machine whose speed
drifts affects both alike. Timing figures: run it alone on the machine (the load average is
printed before and after). The proxy's own CPU time per streamed token (user + system over its
runs, request handling included) is printed too: a busy machine changes it far less than the
latencies; the trace writer's (a process of its own, at a lower priority) is printed beside it,
and the proxy's summary line says whether the writer kept up (no trace line lost).

    python3 benchmarks/record_proxy.py --streams 64,256 --requests-per-stream 10 --rounds 2
    python3 benchmarks/record_proxy.py --wire       # and the proxy's own delay, by the kernel
    python3 benchmarks/record_proxy.py --pin        # the proxy on a CPU of its own

Before the measured runs, one unmeasured run through the proxy at the most streams opens the
proxy's upstream connections, as a proxy that has been serving has them (``--no-warm-up``: a
cold proxy, whose first request on each new client connection waits for the upstream connection
the proxy opens then).

Client-side TTFT and ITL through the proxy include more than the proxy's work: on a machine
whose cores the client, the proxy and the server share, each hop can wait for a CPU, and the
fixed server stamps a request's arrival when its loop reads it, so a request that comes a
little later can meet the server busy writing a tick's tokens. ``--wire`` (root or
CAP_NET_RAW) then starts a fresh proxy, captures the packets on both its sides over two runs
at each stream count (cold: each upstream connection opened as its client's first request
comes; warm: those kept) and prints the proxy's own delay, by the kernel's timestamps, request
by request (matched by ``X-Request-Id``, which the proxy passes on): the request's last byte
out to the server minus its last byte in from the client, and each token event out to the
client minus the same event in from the server.

``--pin`` gives the proxy (and its trace writer) the last CPU and the server and the client the
others, as a proxy in service runs beside the traffic, not on its cores: what is left is the
proxy's own work, not its waiting for a CPU that the other two hold.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from loadlab._analysis import metrics
from loadlab._lab.machine import STEAL_LIMIT, MachineWatch, pin_threads
from loadlab._wire.capture import Capture, check_capture
from loadlab._wire.http import Exchange, read_exchanges
from loadlab.results import read_results
from loadlab.selftest import FixedServerProcess

ROOT = Path(__file__).resolve().parent.parent


def _run(url: str, streams: int, requests: int, out: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "loadlab", "run", "--endpoint", url, "--concurrency",
           str(streams), "--requests", str(requests), "--tokenizer", "none", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    recs = [r for r in read_results(out).records if r.outcome == "ok"]
    ttft = [t for r in recs if (t := metrics.ttft_ms(r)) is not None]
    itl = [g for r in recs for g in metrics.itl_ms(r)]
    return {
        "ok": len(recs),
        "ttft_p50": float(np.percentile(ttft, 50)),
        "ttft_p99": float(np.percentile(ttft, 99)),
        "itl_p50": float(np.percentile(itl, 50)),
        "itl_p99": float(np.percentile(itl, 99)),
    }


PROXY_CPUS: set[int] = set()  # --pin: the proxy's (and its trace writer's) CPUs


def start_proxy(url: str) -> tuple[subprocess.Popen[str], str]:
    """``loadlab record`` in front of ``url``: its process and its address."""
    proxy = subprocess.Popen(
        [sys.executable, "-m", "loadlab", "record", "--listen", "127.0.0.1:0",
         "--upstream", url, "--out", os.devnull, "--force"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proxy.stdout is not None
    via = proxy.stdout.readline().split()[1]  # (listening: its trace writer has started)
    if PROXY_CPUS:
        for proc in [psutil.Process(proxy.pid), *psutil.Process(proxy.pid).children()]:
            pin_threads(proc.pid, PROXY_CPUS)
    return proxy, via


def proxy_delays(inbound: list[Exchange], outbound: list[Exchange]) -> list[dict[str, list[float]]]:
    """The proxy's own delays (ms) by the kernel's packet times, one dict a run (the same
    request id comes once a run, so its k-th time on each side is the same run's): each
    request's last byte, and each token event, out of the proxy minus into it."""
    ups: dict[str | None, list[Exchange]] = {}
    for ex in sorted(outbound, key=lambda e: e.request_last_ns):
        ups.setdefault(ex.request_id, []).append(ex)
    seen: dict[str | None, int] = {}
    runs: list[dict[str, list[float]]] = []
    for ex in sorted(inbound, key=lambda e: e.request_last_ns):
        k = seen[ex.request_id] = seen.get(ex.request_id, -1) + 1
        mates = ups.get(ex.request_id) or []
        if ex.request_id is None or k >= len(mates):
            continue
        u = mates[k]
        while len(runs) <= k:
            runs.append({"request": [], "first token": [], "tokens": []})
        runs[k]["request"].append((u.request_last_ns - ex.request_last_ns) / 1e6)
        gaps = [(a - b) / 1e6 for a, b in zip(ex.times(), u.times(), strict=False)]
        runs[k]["first token"] += gaps[:1]
        runs[k]["tokens"] += gaps
    return runs


def wire_phase(
    url: str, args: argparse.Namespace
) -> tuple[dict[tuple[int, str], dict[str, list[float]]], dict[tuple[int, str], float]]:
    """A fresh proxy, both its sides captured: at each stream count, one run with the proxy
    cold (every upstream connection opened as its client's first request comes), then one
    with it warm (those connections kept). The delays, and each run's steal share."""
    out, stolen = {}, {}
    for streams in map(int, args.streams.split(",")):
        proxy, via = start_proxy(url)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                caps = [Capture(int(u.rsplit(":", 1)[1]), None, Path(tmp) / f"{side}.pcap")
                        for side, u in (("in", via), ("out", url))]  # fmt: skip
                with caps[0], caps[1]:
                    for state in ("cold", "warm"):
                        watch = MachineWatch.start()
                        _run(via, streams, streams * args.requests_per_stream,
                             Path(tmp) / f"{state}.json")  # fmt: skip
                        stolen[(streams, state)] = watch.stop()["steal_share"]
                _, inbound = read_exchanges(caps[0].pcap, caps[0].port)
                _, outbound = read_exchanges(caps[1].pcap, caps[1].port)
        finally:
            proxy.send_signal(signal.SIGTERM)
            proxy.communicate(timeout=30)
        for state, got in zip(("cold", "warm"), proxy_delays(inbound, outbound), strict=False):
            out[(streams, state)] = got
    return out, stolen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="64,256")
    ap.add_argument("--requests-per-stream", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--no-warm-up", action="store_true",
                    help="measure from a cold proxy (no upstream connection open yet)")  # fmt: skip
    ap.add_argument("--wire", action="store_true",
                    help="capture both sides of the proxy: its own delay by the kernel's clock")  # fmt: skip
    ap.add_argument("--pin", action="store_true",
                    help="the proxy on the last CPU, the server and the client on the others")  # fmt: skip
    args = ap.parse_args()
    if args.wire:
        check_capture(None)
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) >= 2:
        PROXY_CPUS.add(cpus[-1])
        os.sched_setaffinity(0, set(cpus[:-1]))  # the server and the clients start from here
        print(f"pinned: the proxy on CPU {cpus[-1]}, the server and the client on {cpus[:-1]}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    rows: list[dict[str, Any]] = []
    with FixedServerProcess(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens=args.tokens) as url:
        proxy, via = start_proxy(url)
        cpu_s: dict[int, float] = {}  # streams -> the proxy's CPU seconds over its runs
        proc = psutil.Process(proxy.pid)
        (writer,) = proc.children()  # the trace writer: its CPU is not the proxy's
        writer_s: dict[int, float] = {}
        try:
            with tempfile.TemporaryDirectory() as tmp:
                if not args.no_warm_up:  # the proxy's upstream connections, as in service
                    most = max(map(int, args.streams.split(",")))
                    _run(via, most, most, Path(tmp) / "warm-up.json")
                for streams in map(int, args.streams.split(",")):
                    n = streams * args.requests_per_stream
                    for rnd in range(args.rounds):
                        order = ("direct", "proxy") if rnd % 2 == 0 else ("proxy", "direct")
                        for how in order:
                            before = sum(proc.cpu_times()[:2])
                            before_w = sum(writer.cpu_times()[:2])
                            watch = MachineWatch.start()
                            fig = _run(url if how == "direct" else via, streams, n,
                                       Path(tmp) / f"{how}-{streams}-{rnd}.json")  # fmt: skip
                            fig["steal"] = watch.stop()["steal_share"]
                            if how == "proxy":
                                spent = sum(proc.cpu_times()[:2]) - before
                                cpu_s[streams] = cpu_s.get(streams, 0.0) + spent
                                spent_w = sum(writer.cpu_times()[:2]) - before_w
                                writer_s[streams] = writer_s.get(streams, 0.0) + spent_w
                            rows.append({"streams": streams, "round": rnd, "how": how, **fig})
                            print(json.dumps(rows[-1]), flush=True)
        finally:
            proxy.send_signal(signal.SIGTERM)
            _, err = proxy.communicate(timeout=30)
        wire, wire_steal = wire_phase(url, args) if args.wire else ({}, {})
    print(err.strip().splitlines()[-1] if err.strip() else "(the proxy printed no summary)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("\nstreams  via     TTFT p50  TTFT p99  ITL p50  ITL p99   (ms, mean of rounds)")
    worst = stolen = 0.0
    for streams in sorted({r["streams"] for r in rows}):
        mean = {}
        for how in ("direct", "proxy"):
            rs = [r for r in rows if r["streams"] == streams and r["how"] == how]
            mean[how] = {
                k: float(np.mean([r[k] for r in rs]))
                for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
            }
            m = mean[how]
            print(f"{streams:>7}  {how:<6}  {m['ttft_p50']:8.2f}  {m['ttft_p99']:8.2f}  "
                  f"{m['itl_p50']:7.2f}  {m['itl_p99']:7.2f}")  # fmt: skip
        d = {k: mean["proxy"][k] - mean["direct"][k] for k in mean["proxy"]}
        worst = max(worst, d["ttft_p99"], d["itl_p99"])
        tokens = streams * args.requests_per_stream * args.rounds * args.tokens
        steal = max(r["steal"] for r in rows if r["streams"] == streams)
        stolen = max(stolen, steal)
        print(f"{streams:>7}  cost    {d['ttft_p50']:+8.2f}  {d['ttft_p99']:+8.2f}  "
              f"{d['itl_p50']:+7.2f}  {d['itl_p99']:+7.2f}   proxy CPU "
              f"{1e6 * cpu_s[streams] / tokens:.1f} us/token (trace writer "
              f"{1e6 * writer_s[streams] / tokens:.1f}); steal up to {steal:.0%}")  # fmt: skip
    for (streams, state), got in wire.items():
        steal = wire_steal[(streams, state)]
        stolen = max(stolen, steal)
        print(f"\nthe proxy's own delay at {streams} streams, {state}, by the kernel's packet "
              f"times (ms; steal {steal:.0%}):")  # fmt: skip
        for k, v in got.items():
            if v:
                q = np.percentile(v, [50, 99])
                print(f"  {k:12s} p50 {q[0]:6.3f}  p99 {q[1]:6.3f}  max {max(v):7.3f}  ({len(v)})")
    verdict = "within" if worst <= 1.0 else "NOT within"
    print(f"\nproxy cost at p99: {verdict} 1 ms (worst {worst:+.2f} ms); a busy machine inflates "
          "this figure: run it alone")  # fmt: skip
    if stolen > STEAL_LIMIT:
        print(f"the hypervisor took up to {stolen:.0%} of the CPU time during a run (steal): "
              "these figures are the machine's, not the proxy's; run again")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
