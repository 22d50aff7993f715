"""What the SSE line and event limit costs per read: the decoder of this tree against
the decoder of a git revision without it, interleaved, best of N rounds of 4,000 reads.

    python3 benchmarks/sse_limit_cost.py --base 4eede83

Three stream shapes: one OpenAI event per read (the decoder's one-line fast path), the same
events split over two reads (the full way, where the limit is checked), and Anthropic's
``event:``/``data:`` blocks. The token-frame fast path of the stream state never reaches the
decoder, so it is not measured here.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadlab.clients import _sse as current  # noqa: E402

EVENT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
)
ANTHROPIC = (
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" t"}}\n\n'
)
SHAPES = {
    "one event per read": [EVENT] * 4000,
    "events split over reads": [EVENT[:50], EVENT[50:]] * 2000,
    "event+data blocks": [ANTHROPIC] * 4000,
}


def _decoder_at(rev: str) -> ModuleType:
    src = subprocess.run(
        ["git", "show", f"{rev}:loadlab/clients/_sse.py"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "sse_base.py"
    path.write_text(src, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("sse_base", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sse_base"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _ns_per_read(module: ModuleType, reads: list[bytes]) -> float:
    feed = module.SSEDecoder().feed_raw
    t = time.perf_counter_ns()
    for r in reads:
        feed(r)
    return (time.perf_counter_ns() - t) / len(reads)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="git revision whose decoder has no limit")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (best is shown)")
    args = p.parse_args()
    base = _decoder_at(args.base)
    for name, reads in SHAPES.items():
        old: list[float] = []
        new: list[float] = []
        for _ in range(args.rounds):  # interleaved, so a busy moment hits both
            old.append(_ns_per_read(base, reads))
            new.append(_ns_per_read(current, reads))
        print(f"{name:24s} base {min(old):6.0f} ns/read  limit {min(new):6.0f} ns/read  "
              f"(medians {statistics.median(old):.0f} / {statistics.median(new):.0f})")  # fmt: skip


if __name__ == "__main__":
    main()
