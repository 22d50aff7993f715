"""``loadlab merge``: join the results files of one run's shards into one.

    loadlab merge shard-0.json shard-1.json shard-2.json --out run.json

Each file comes from ``loadlab run ... --shard K/N --start-at TIME`` (one part of the run's
schedule, started at the common time). Files of different runs, or one shard twice, are refused
(exit 2); a shard that is missing is said and kept in the merged file (``extra.shards.missing``),
and the exit status is then 1. ``report``, ``slo``, ``compare`` and ``sweep``'s readers take the
merged file like any other.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="SHARD.json", help="the shards' results files")
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help="the merged file")


def run(args: argparse.Namespace) -> int:
    from loadlab._analysis.shards import merge_shards
    from loadlab._report.output import write_output
    from loadlab.results import read_results, write_results

    parts = [read_results(f) for f in args.files]
    merged = merge_shards(parts, args.files)
    info = merged.extra["shards"]
    path = write_output(args.out, "--out", lambda p: write_results(merged, p))
    print(f"merged shards {info['merged']} of {info['count']}: {len(merged.records):,} records")
    print(f"results: {path}")
    if info["missing"]:
        print(f"loadlab merge: shards {info['missing']} of {info['count']} are missing: their "
              "part of the schedule is not in the merged file", file=sys.stderr)  # fmt: skip
        return 1
    return 0
