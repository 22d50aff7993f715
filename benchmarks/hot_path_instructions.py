"""Machine instructions of the client's hot path per token chunk and per request, counted by
callgrind (valgrind), so a busy machine does not move them.

The replay of ``tests/clients/test_hot_path_budget.py`` (a recorded stream through
``send``, the connection's ``data_received`` and parse queue, the HTTP reader, the stream
state, the record, the runner's bookkeeping and the journal line; no socket, no event loop)
runs ``--reps`` times for streams of 64 and of 128 token chunks, in a process of its own under
callgrind, which counts only inside the replay (``--toggle-collect``), with the heap frozen
as a run freezes it. The difference over
64 chunks is the work of one more chunk; the rest is the work of a request.

    python3 benchmarks/hot_path_instructions.py                       # OpenAI chat, ~3 minutes
    python3 benchmarks/hot_path_instructions.py --kinds openai,anthropic,openai_behind
    python3 benchmarks/hot_path_instructions.py --tree /path/to/other/checkout  # its loadlab

``--tree`` counts another checkout's ``loadlab`` through this checkout's replay (a tree whose
client internals the replay does not know fails). The counts are of this CPython build and
this CPU's instruction set: compare them with each other, not across machines. The kernel's
work per read (the socket read, the ACK it sends) and the event loop's are not in them:
``benchmarks/client_overhead.py`` measures the whole client's CPU.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "clients" / "test_hot_path_budget.py"
KINDS = ("openai", "anthropic", "openai_behind")


def child(kind: str, tokens: int, reps: int) -> None:
    """Under callgrind: replay ``reps`` requests inside ``functools.reduce``, the one stretch
    callgrind counts."""
    spec = importlib.util.spec_from_file_location("hot_path_budget", HARNESS)
    assert spec is not None and spec.loader is not None
    harness = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = harness  # its dataclasses look their module up
    spec.loader.exec_module(harness)
    one = harness.replayer(kind, tokens, Path(tempfile.mkdtemp()))
    # the run's collector policy (``loadlab._runner.runner``): the heap frozen, so a collection
    # walks what the replays allocated, not every module, whenever the counts happen to call one
    gc.freeze()
    functools.reduce(lambda _a, _b: one(), range(reps), None)


def instructions(tree: Path, kind: str, tokens: int, reps: int) -> int:
    """Instructions callgrind counted in ``reps`` replays of a ``tokens``-chunk request."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            "valgrind", "--tool=callgrind", "--toggle-collect=functools_reduce",
            f"--callgrind-out-file={tmp}/callgrind.out", sys.executable, __file__,
            "--child", kind, str(tokens), str(reps),
        ]  # fmt: skip
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)]),
            "PYTHONHASHSEED": "0",  # the same dict layouts every run
            "OPENBLAS_NUM_THREADS": "1",  # no idle threads spinning inside the count
        }
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"callgrind run failed ({kind}, {tokens} tokens):\n{proc.stderr[-2000:]}")
    return int(found[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", default="openai", help=f"comma-separated, of {', '.join(KINDS)}")
    p.add_argument("--reps", type=int, default=10, help="requests replayed per count")
    p.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose loadlab runs")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child[0], int(a.child[1]), int(a.child[2]))
        return 0
    if shutil.which("valgrind") is None:
        print("error: valgrind is not installed (apt-get install valgrind)")
        return 2
    kinds = a.kinds.split(",")
    if unknown := [k for k in kinds if k not in KINDS]:
        print(f"error: --kinds {','.join(unknown)}: expected some of {', '.join(KINDS)}")
        return 2
    print(f"loadlab at {a.tree.resolve()}; Python {sys.version.split()[0]}; {a.reps} reps")
    for kind in kinds:
        small = instructions(a.tree, kind, 64, a.reps)
        big = instructions(a.tree, kind, 128, a.reps)
        chunk = (big - small) / (64 * a.reps)
        request = big / a.reps - 128 * chunk
        print(
            f"  {kind:14s} {chunk:9,.0f} instructions per token chunk   {request:11,.0f} per request"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
