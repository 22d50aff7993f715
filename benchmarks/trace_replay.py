"""Trace replay fidelity: the Azure conversation trace at 60x for 60 s of trace time.

Starts the reference server (unless --endpoint is given), runs the user-facing command
``loadlab run --scenario scenarios/azure_conv.toml --endpoint URL``, then reads the results
file and prints:

  * send lag behind the trace's schedule (sent - intended): p50 / p99 / max, ms
    (acceptance: p99 <= 5 ms)
  * whether every request's prompt and output length (server usage) equal the trace row's
  * the arrival rate over time: the trace's (scheduled) vs actually sent, per bin

Usage::

    python3 benchmarks/trace_replay.py                       # cpu preset, 60x, 60 s of trace
    python3 benchmarks/trace_replay.py --preset tiny --trace-seconds 30
    python3 benchmarks/trace_replay.py --endpoint http://127.0.0.1:8000 --model loadlab-ref

Rows longer than the server's context (prompt + output > --max-model-len) cannot be served
as they are: they are skipped in the replay (``max_total_tokens``) and counted separately.
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
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadlab.results import read_results  # noqa: E402
from loadlab.workloads._replay import trace_source  # noqa: E402
from loadlab.workloads._trace import iter_trace, replay_fidelity  # noqa: E402


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    return repr(v)


def dump_toml(data: Mapping[str, Any]) -> str:
    """Enough TOML for a scenario: top-level scalars, then one-level tables."""
    lines = [f"{k} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, Mapping)]
    for k, v in data.items():
        if isinstance(v, Mapping):
            lines += ["", f"[{k}]", *(f"{kk} = {toml_value(vv)}" for kk, vv in v.items())]
    return "\n".join(lines) + "\n"


def renice_all_threads(pid: int, nice: int) -> None:
    """Lower a process's priority, every thread of it (Linux sets niceness per thread; threads
    created later inherit it). On a 2-core machine the server's torch threads otherwise
    starve the load generator, and the send lag measures the OS scheduler, not loadlab."""
    tasks = Path(f"/proc/{pid}/task")
    for tid in [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [pid]:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, nice)


@contextlib.contextmanager
def server(args: argparse.Namespace) -> Iterator[str]:
    if args.endpoint:
        yield args.endpoint
        return
    from reference_server.launch import start_server

    extra = ["--max-model-len", str(args.max_model_len), "--max-queue", "4096", *args.server_arg]
    print(f"starting the reference server: mode={args.mode} preset={args.preset}", flush=True)
    with start_server(mode=args.mode, preset=args.preset, extra_args=extra, timeout_s=300) as s:
        if args.server_nice:
            renice_all_threads(s.process.pid, args.server_nice)
        yield s.url


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default=str(ROOT / "scenarios" / "azure_conv.toml"))
    p.add_argument("--endpoint", help="an already running server (default: start one)")
    p.add_argument("--model", default="loadlab-ref")
    p.add_argument("--preset", default="cpu", help="reference server preset (cpu, tiny, fake)")
    p.add_argument("--mode", default="continuous")
    p.add_argument("--max-model-len", type=int, default=4096, help="server context in tokens")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra loadlab-server argument (repeatable), e.g. --server-arg=--max-num-seqs=16")  # fmt: skip
    p.add_argument("--time-scale", type=float, help="override the scenario's time_scale")
    p.add_argument("--trace-seconds", type=float, help="override the window's duration_s")
    p.add_argument("--server-nice", type=int, default=10,
                   help="niceness of the started server's threads (0 = leave it)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=600.0, help="whole-request timeout, s")
    p.add_argument("--read-timeout", type=float, default=300.0, help="longest silence, s")
    p.add_argument("--bin-s", type=float, default=0.1, help="rate bins, wall seconds")
    p.add_argument("--out", default=str(ROOT / "reports" / "trace_replay.json"))
    args = p.parse_args()

    data = tomllib.loads(Path(args.scenario).read_text())
    wl = dict(data["workload"])
    if args.time_scale:
        wl["time_scale"] = args.time_scale
    if args.trace_seconds:
        wl["duration_s"] = args.trace_seconds
    wl["path"] = str(trace_source(wl, (Path(args.scenario).parent,)))  # a name or a file
    wl.pop("trace", None)
    wl["max_total_tokens"] = args.max_model_len
    data["workload"] = wl
    data["progress"] = False
    scale = float(wl.get("time_scale", 1.0))
    start, dur = float(wl.get("start_s", 0.0)), wl.get("duration_s")
    rows = list(iter_trace(wl["path"], start_s=start, duration_s=dur))
    by_id = {f"trace-{r.line}": r for r in rows}
    too_long = sum(1 for r in rows if r.prompt_tokens + r.output_tokens > args.max_model_len)

    with tempfile.TemporaryDirectory() as tmp:
        scen = Path(tmp) / "replay.toml"
        scen.write_text(dump_toml(data))
        with server(args) as url:
            cmd = [sys.executable, "-m", "loadlab", "run", "--scenario", str(scen),
                   "--endpoint", url, "--model", args.model, "--out", args.out,
                   "--timeout", str(args.timeout), "--read-timeout", str(args.read_timeout)]  # fmt: skip
            print("running:", " ".join(cmd[1:]), flush=True)
            t = time.perf_counter()
            proc = subprocess.run(cmd, cwd=ROOT, check=False)
            wall = time.perf_counter() - t
    if proc.returncode not in (0, 1):
        print(f"loadlab run failed with exit code {proc.returncode}", file=sys.stderr)
        return 1
    res = read_results(args.out)
    recs = res.records
    fid = replay_fidelity(recs, bin_s=args.bin_s)
    ok = [r for r in recs if r.ok]
    exact = [
        r
        for r in ok
        if r.prompt_tokens == by_id[r.request_id].prompt_tokens
        and r.output_tokens == by_id[r.request_id].output_tokens
    ]
    outcomes: dict[str, int] = {}
    for r in recs:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    lag = fid["send_lag_ms"]
    print(f"\ntrace window: {len(rows)} rows over {dur} s of trace time at {scale:g}x "
          f"({too_long} longer than the {args.max_model_len}-token context, skipped)")  # fmt: skip
    print(f"requests: {len(recs)} sent/recorded, outcomes {outcomes}, run wall {wall:.1f} s")
    print(f"send lag ms: p50 {lag['p50']:.3f}  p99 {lag['p99']:.3f}  max {lag['max']:.3f}  "
          f"(acceptance p99 <= 5 ms: {'PASS' if lag['p99'] is not None and lag['p99'] <= 5 else 'FAIL'})")  # fmt: skip
    gen = res.generator
    print(f"generator: saturated {gen.get('saturated')}, event-loop lag p99 "
          f"{gen.get('loop_lag_ms_p99')} ms, scheduler dispatch lag p99 "
          f"{gen.get('dispatch_lag_ms_p99')} ms (the rest of the send lag is the client's send path)")  # fmt: skip
    print(f"lengths equal to the trace (prompt and output, server usage): {len(exact)}/{len(ok)} ok requests")  # fmt: skip
    print(f"arrival rate per {args.bin_s:g} s bin (= {args.bin_s * scale:g} s of trace), req/s:")
    print("  bin  trace  sent")
    for i, (a, b) in enumerate(zip(fid["scheduled_rate_rps"], fid["sent_rate_rps"], strict=True)):
        print(f"  {i:3d} {a:6.0f} {b:5.0f}")
    print(f"largest bin difference: {fid['max_rate_diff_rps']:.0f} req/s")
    summary = {"send_lag_ms": lag, "generator": {k: v for k, v in gen.items() if k != "samples"}, "exact_lengths": len(exact), "ok": len(ok),
               "outcomes": outcomes, "too_long_skipped": too_long, "fidelity": fid}  # fmt: skip
    Path(args.out).with_suffix(".fidelity.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
