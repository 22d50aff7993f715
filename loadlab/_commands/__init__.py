"""The subcommands (one module each, ``loadlab.cli`` loads them), and what the offline ones
share: reading a results file with the machine's cores, saying on stderr what a long step is
doing (a file of a million records takes seconds, not an instant)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadlab.results import Results

__all__ = ["BIG_FILE_BYTES", "read_said", "say"]

BIG_FILE_BYTES = 64 << 20  # from this size up, reading a file is said on stderr


def say(command: str, text: str) -> None:
    """One progress line on stderr (stdout keeps the report)."""
    print(f"loadlab {command}: {text}", file=sys.stderr, flush=True)


def read_said(path: str | os.PathLike[str], command: str) -> Results:
    """``read_results`` with up to four processes, and for a big file a line before and after
    (the records, the seconds)."""
    from loadlab.results import read_results

    p = Path(path)
    try:
        big = p.stat().st_size >= BIG_FILE_BYTES
    except OSError:
        big = False  # read_results says why
    if big:
        say(command, f"reading {p} ({p.stat().st_size / 1e6:,.0f} MB) ...")
    t0 = time.perf_counter()
    results = read_results(p, workers=min(4, os.cpu_count() or 1))
    if big:
        n = len(results.records)
        say(command, f"read {n:,} records in {time.perf_counter() - t0:.1f} s; summarising ...")
    return results
