"""Two code trees side by side: the same heavy load through each tree's ``loadlab run``, in
alternating order, against one fixed-schedule server that logs its own truth.

    python3 benchmarks/side_by_side.py /path/to/old-checkout /path/to/new-checkout
    python3 benchmarks/side_by_side.py OLD NEW --rounds 3 --streams 256 --requests 2560
    python3 benchmarks/side_by_side.py OLD NEW --streams 8 --requests 32 --tokens 16  # a check

The server is this checkout's ``python -m loadlab.selftest`` in its own process (one for
every run, so both trees meet the same server): each request's first token ``--ttft-ms`` after
the kernel stamped its arrival, then one every ``--itl-ms``, each write's time logged before
the bytes go out. Each tree runs as ``python -m loadlab run`` from its own folder (its own
``PYTHONPATH``), closed loop, ``--workers`` processes (default one), in the order A, B, B, A,
A, B, ... (the order cancels a drift that is linear in time). Per run it prints:

- server tok/s: the tokens the server wrote over the span from the first request's arrival to
  the last write (what the selftest calls the server's rate), and, beside it, what the
  schedule allows at most (streams x tokens / (ttft + (tokens - 1) x itl));
- TTFT err p50/p99: each answered request's first-token read time minus the server's write
  time of that token (ms; a client that reads late, or stamps late, shows here);
- client us/tok: loadlab's own CPU (user + system, every worker process) per token read;
- server CPU: the server process's CPU time over its busy span (first arrival to last
  write), in % of one core (near 100: the server, not the client, was the limit);
- the 1-minute load average before the run, and whether loadlab called itself saturated;
- late / counted: the first tokens read more than the saturation threshold (20 ms) after the
  server wrote them, beside how many of them loadlab itself counted as read just after its
  event loop had been away that long (``stalled_first_tokens``; "-" for a tree without that
  watch), and the worst of each (ms).

``--burn`` runs a process that keeps one core busy beside every run (the client and the
server then share what is left): the way to see the generator's own saturation checks work.

Requests the tree sent before its load (a prompt-length calibration) are left out: only the
request ids in the results file count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadlab.selftest import FixedServerProcess  # noqa: E402


def _http_json(url: str, method: str = "GET") -> Any:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)  # noqa: S310 - loopback
    with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - loopback
        body = resp.read()
    return json.loads(body) if body else None


def _cpu_ticks(pid: int) -> int:
    """User + system clock ticks of process ``pid`` so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def measure(results: dict[str, Any], truth: dict[str, Any]) -> dict[str, Any]:
    """Server rate and TTFT error of one run: its results file against the server's log."""
    t0 = int(results["extra"]["t0_ns"])
    records = results["records"]
    ok = [r for r in records if r["outcome"] == "ok"]
    mine = [truth[r["request_id"]] for r in records if r["request_id"] in truth]
    written = sum(len(t["chunk_ns"]) for t in mine)
    first = min((int(t["recv_ns"]) for t in mine), default=0)
    last = max((int(t["chunk_ns"][-1]) for t in mine if t["chunk_ns"]), default=first)
    errors = [
        (t0 + r["chunk_ns"][0] - int(truth[r["request_id"]]["chunk_ns"][0])) / 1e6
        for r in ok
        if r["chunk_ns"] and truth.get(r["request_id"], {}).get("chunk_ns")
    ]
    generator = results.get("generator") or {}
    parts = generator.get("parts") or [generator]
    threshold = float(generator.get("threshold_ms") or parts[0].get("threshold_ms") or 20.0)
    counted = [p.get("stalled_first_tokens") for p in parts]
    cpu_s = sum(float(p.get("cpu_s") or 0.0) for p in parts)
    read = sum(len(r["chunk_ns"]) for r in ok)
    return {
        "requests": len(records),
        "ok": len(ok),
        "server_span_s": (last - first) / 1e9,
        "server_tps": written / max((last - first) / 1e9, 1e-9),
        "ttft_err_p50_ms": _pct(errors, 50),
        "ttft_err_p99_ms": _pct(errors, 99),
        "client_us_per_token": 1e6 * cpu_s / read if read else None,
        "saturated": bool(generator.get("saturated")),
        "late": sum(e > threshold for e in errors),
        "late_max_ms": max(errors, default=0.0),
        "counted": None if None in counted else sum(int(c or 0) for c in counted),
        "counted_max_ms": max(float(p.get("stalled_first_token_ms_max") or 0.0) for p in parts),
    }


def run_tree(tree: Path, url: str, out: Path, a: argparse.Namespace) -> tuple[int, str]:
    """One ``loadlab run`` of ``tree``; its exit code and the tail of what it printed."""
    cmd = [
        a.python, "-m", "loadlab", "run", "--endpoint", url, "--model", "loadlab-fixed",
        "--concurrency", str(a.streams), "--requests", str(a.requests),
        "--max-tokens", str(a.tokens), "--prompt-tokens", str(a.prompt_tokens),
        "--workers", str(a.workers), "--no-progress", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=a.timeout_s, check=False
    )
    return proc.returncode, (proc.stdout + proc.stderr)[-600:]


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="tree A: a loadlab checkout (its folder)")
    p.add_argument("b", type=Path, help="tree B")
    p.add_argument("--labels", default="A,B", help="names of the two trees in the output")
    p.add_argument("--rounds", type=int, default=2, help="runs per tree")
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--requests", type=int, default=2560)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=5.0)
    p.add_argument("--workers", type=int, default=1, help="loadlab processes per run")
    p.add_argument("--python", default=sys.executable, help="interpreter for both trees")
    p.add_argument("--timeout-s", type=float, default=600.0, help="the most one run may take")
    p.add_argument("--burn", action="store_true", help="a process burning one core beside each run")
    a = p.parse_args()
    trees = {}
    for label, tree in zip(a.labels.split(","), (a.a, a.b), strict=True):
        if not (tree / "loadlab" / "__main__.py").is_file():
            print(f"error: {tree} is not a loadlab checkout (no loadlab/__main__.py)")
            return 2
        trees[label] = tree.resolve()
    labels = list(trees)
    order = [labels[::-1] if r % 2 else labels for r in range(a.rounds)]
    schedule_tps = a.streams * a.tokens / ((a.ttft_ms + (a.tokens - 1) * a.itl_ms) / 1e3)
    print(
        f"side by side: {a.streams} streams, {a.requests} requests of {a.tokens} tokens, server "
        f"TTFT {a.ttft_ms:g} ms ITL {a.itl_ms:g} ms (its schedule allows {schedule_tps:,.0f} "
        f"tok/s), loadlab --workers {a.workers}; {os.cpu_count()} CPUs"
    )
    for label, tree in trees.items():
        print(f"  {label}: {tree}")
    head = (
        "run  tree   server tok/s   TTFT err p50 / p99 ms   client us/tok   server CPU   load1"
        "   late / counted (max ms)"
    )
    print(head)
    rows: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        for pair in order:
            for label in pair:
                n += 1
                server = FixedServerProcess(ttft_ms=a.ttft_ms, itl_ms=a.itl_ms, tokens=a.tokens)
                burner = subprocess.Popen([a.python, "-c", "while True: pass"]) if a.burn else None
                with server as url:
                    assert server.proc is not None
                    load1 = os.getloadavg()[0]
                    ticks0 = _cpu_ticks(server.proc.pid)
                    out = Path(tmp) / f"run{n}.json"
                    rc, said = run_tree(trees[label], url, out, a)
                    ticks1 = _cpu_ticks(server.proc.pid)
                    truth = _http_json(f"{url}/truth")
                if burner is not None:
                    burner.kill()
                    burner.wait()
                if rc != 0 or not out.is_file():
                    print(f"{n:>3}  {label:5s}  loadlab run failed (exit {rc}): {said}")
                    continue
                m = measure(json.loads(out.read_text()), truth)
                # the server idles while loadlab starts and ends: its CPU over its busy span
                server_s = (ticks1 - ticks0) / os.sysconf("SC_CLK_TCK")
                m["server_cpu_pct"] = 100 * server_s / max(m["server_span_s"], 1e-9)
                m["load1"] = load1
                rows[label].append(m)
                flag = "  saturated" if m["saturated"] else ""
                lost = "" if m["ok"] == m["requests"] else f"  ({m['ok']} of {m['requests']} ok)"
                counted = (
                    "-" if m["counted"] is None else f"{m['counted']} ({m['counted_max_ms']:.1f})"
                )
                print(
                    f"{n:>3}  {label:5s}  {m['server_tps']:>12,.0f}   "
                    f"{_f(m['ttft_err_p50_ms'], '7.2f')} / {_f(m['ttft_err_p99_ms'], '7.2f')}"
                    f"       {_f(m['client_us_per_token'], '9.1f')}   "
                    f"{m['server_cpu_pct']:8.0f} %   {load1:5.2f}"
                    f"   {m['late']} ({m['late_max_ms']:.1f}) / {counted}{flag}{lost}"
                )
    print("median per tree:")
    for label, ms in rows.items():
        if ms:
            tps = statistics.median(m["server_tps"] for m in ms)
            p99s = [m["ttft_err_p99_ms"] for m in ms if m["ttft_err_p99_ms"] is not None]
            p99 = statistics.median(p99s) if p99s else None
            print(
                f"  {label}: server {tps:,.0f} tok/s, TTFT err p99 {_f(p99, '.2f')} ms "
                f"({len(ms)} runs)"
            )
    return 0 if all(len(ms) == a.rounds for ms in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
