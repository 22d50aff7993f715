"""How long ``loadlab report``, ``slo`` and ``compare`` take on a results file of a million
records, and how much memory each needs: wall seconds, CPU seconds (user and system, its
parser processes included: on a shared machine the steadier figure) and peak RSS of each
command, run as a user would (``python -m loadlab ...`` in its own process).

    python3 benchmarks/large_results.py                       # 1,000,000 records a file
    python3 benchmarks/large_results.py --records 20000       # a quick check that it runs

Writes two files in the shape ``loadlab run`` writes (every record field, in its order; a
second "B" file whose TTFT is 10 % slower, for ``compare``): seeded records of ``--tokens``
chunks each, arriving at ``--rate`` requests/s (a day-long soak at the default: 1,000,000
requests at 12 rps), 1 % failed (HTTP 500 with an error text, timeouts). Building the files is
not timed. The target: each command under 20 s and under 1.5 GB peak RSS. Last, the first
file is read and written again as a run writes its results (``write_results``): the seconds
of the write alone are its last stderr line.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadlab.records import RequestRecord
from loadlab.results import SCHEMA, SCHEMA_VERSION, environment_info

ROOT = Path(__file__).resolve().parent.parent
SLO = ROOT / "examples" / "slo.toml"
MS = 1_000_000
BATCH = 20_000  # records built and written at a time (bounds this script's own memory)
TEMPLATE: dict[str, object] = {}  # a record's fields at their defaults, in the file's order


def _batch(start: int, n: int, rng: np.random.Generator, a: argparse.Namespace) -> bytes:
    """``n`` records from index ``start``, as the comma-separated JSON objects of the array
    (each as ``RequestRecord.to_dict`` writes it: every field, in its order)."""
    k = a.tokens
    sent = ((start + np.arange(n)) / a.rate * 1e9 + rng.uniform(0, 1e8, n)).astype(np.int64)
    ttft = (rng.gamma(4.0, a.ttft_ms / 4.0, n) * a.ttft_scale * MS).astype(np.int64)
    gaps = (rng.gamma(8.0, 20.0 / 8.0, (n, k - 1)) * MS).astype(np.int64)
    chunks = (sent + ttft)[:, None] + np.concatenate(
        [np.zeros((n, 1), np.int64), np.cumsum(gaps, axis=1)], axis=1
    )
    fate = rng.random(n)
    prompt = rng.integers(120, 136, n)
    out = []
    for j in range(n):
        i, s = start + j, int(sent[j])
        rec = dict(TEMPLATE, request_id=f"r{i}", sent_ns=s, headers_ns=s + MS)
        if fate[j] < 0.005:
            rec.update(outcome="http_500", end_ns=s + 5 * MS, http_status=500,
                       error="HTTP 500: upstream overloaded")  # fmt: skip
        elif fate[j] < 0.01:
            c = chunks[j, : k // 2].tolist()
            rec.update(outcome="timeout", chunk_ns=c, chunk_tokens=[1] * len(c),
                       end_ns=c[-1] + 30_000 * MS, error="no byte for 30 s (read timeout)",
                       output_tokens=len(c), output_tokens_source="chunks",
                       output_tokens_chunks=len(c))  # fmt: skip
        else:
            c = chunks[j].tolist()
            rec.update(chunk_ns=c, chunk_tokens=[1] * k, end_ns=c[-1] + MS,
                       prompt_tokens=int(prompt[j]), output_tokens=k, output_tokens_source="usage",
                       output_tokens_chunks=k, finish_reason="length")  # fmt: skip
        out.append(orjson.dumps(rec))
    return b",".join(out)


def write_file(path: Path, a: argparse.Namespace, seed: int) -> None:
    """A results file of ``a.records`` records (no ``summary``: readers recompute it)."""
    global TEMPLATE
    TEMPLATE = RequestRecord("", http_status=200, max_tokens=a.tokens,
                             prompt_tokens_requested=128).to_dict()  # fmt: skip
    rng = np.random.default_rng(seed)
    duration = int((a.records / a.rate + 60) * 1e9)
    run = {"started_at": "2026-12-01T00:00:00Z", "duration_ns": duration,
           "window_ns": [0, duration], "scheduled": a.records, "workers": 1, "kind": "run"}  # fmt: skip
    config = {"endpoint": "http://127.0.0.1:8000", "rate_rps": a.rate, "max_tokens": a.tokens}
    head = {"schema": SCHEMA, "version": SCHEMA_VERSION, "run": run, "config": config,
            "environment": environment_info(), "generator": {"saturated": False}}  # fmt: skip
    with path.open("wb") as fh:
        fh.write(orjson.dumps(head)[:-1] + b',"records":[')
        for start in range(0, a.records, BATCH):
            if start:
                fh.write(b",")
            fh.write(_batch(start, min(BATCH, a.records - start), rng, a))
        fh.write(b'],"server_samples":[],"extra":{}}')


WRITE = """import sys, time
from loadlab.results import read_results, write_results
res = read_results(sys.argv[1], workers=2)
t = time.perf_counter()
write_results(res, sys.argv[2])
print(f"written in {time.perf_counter() - t:.1f} s", file=sys.stderr)
"""


def _own_pages(pid: int) -> int:
    """Bytes of a process's pages no other process shares (a forked child shares its
    parent's until it writes them): its private ones, from the kernel's summary."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    return sum(int(line.split()[1]) * 1024 for line in text.splitlines()
               if line.startswith(("Private_Clean:", "Private_Dirty:")))  # fmt: skip


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that have ended, theirs
    included."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(cmd: list[str]) -> tuple[float, float, float, float, int, str]:
    """Wall seconds, CPU seconds (the command's and its children's), peak RSS (MB) of the
    command's own process and of it with its children (their unique pages: a command may
    parse in a pool of forked processes), both sampled every 50 ms, exit code, and the last
    line it wrote on stderr (its progress)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryFile("w+") as err:
        cpu0 = _children_cpu()
        t0 = time.perf_counter()
        proc = psutil.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        own = tree = 0.0
        while proc.poll() is None:
            try:
                mine = proc.memory_info().rss
                kids = sum(_own_pages(c.pid) for c in proc.children(recursive=True))
                own, tree = max(own, mine / 2**20), max(tree, (mine + kids) / 2**20)
            except psutil.Error:
                pass  # a member ended between the listing and the reading
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        cpu = _children_cpu() - cpu0
        err.seek(0)
        lines = err.read().strip().splitlines()
    return wall, cpu, own, max(tree, own), proc.returncode, lines[-1] if lines else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--tokens", type=int, default=16, help="token chunks per request")
    ap.add_argument("--rate", type=float, default=12.0, help="requests/s of the synthetic run")
    ap.add_argument("--ttft-ms", type=float, default=100.0)
    ap.add_argument("--dir", help="where to write the files (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="time the files already in --dir")
    a = ap.parse_args()
    print(f"load average before: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(a.dir or tmp)
        d.mkdir(parents=True, exist_ok=True)
        files = [d / "A.json", d / "B.json"]
        t0 = time.perf_counter()
        for i, path in enumerate(files):
            a.ttft_scale = 1.0 + 0.1 * i
            if not (a.reuse and path.is_file()):
                write_file(path, a, seed=i)
        size = files[0].stat().st_size / 1e6
        print(f"{a.records:,} records x {a.tokens} chunks: {size:,.0f} MB a file "
              f"(built in {time.perf_counter() - t0:.0f} s, not timed)")  # fmt: skip
        py = [sys.executable, "-m", "loadlab"]
        commands = {
            "report": [*py, "report", str(files[0])],
            "slo": [*py, "slo", str(files[0]), "--slo", str(SLO)],
            "compare": [*py, "compare", str(files[0]), str(files[1]), "--fail-on-regression", "5"],
            # the file read (not timed), then written again as a run writes its results
            "write": [sys.executable, "-c", WRITE, str(files[0]), str(d / "written.json")],
        }
        for name, cmd in commands.items():
            wall, cpu, own, tree, code, last = timed(cmd)
            print(f"  {name:8s} {wall:7.1f} s  CPU {cpu:6.1f} s  peak RSS {tree:7,.0f} MB "
                  f"(all its processes; the command's own {own:,.0f} MB)  exit {code}  "
                  f"(stderr's last line: {last[:60]!r})", flush=True)  # fmt: skip
    print(f"load average after: {Path('/proc/loadavg').read_text().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
