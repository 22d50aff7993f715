"""``loadlab lab``: start the reference server in each mode and show the modes side by side.

    loadlab lab                                  # cpu preset, all four modes (~10 min, 2 cores)
    loadlab lab --quick                          # tiny preset, seconds (what the tests run)
    loadlab lab --preset 1b --out reports/lab-gpu   # one GPU
    loadlab lab --modes continuous,chunked --duration 60

Writes ``<out>/lab.md``, ``lab.html``, ``lab.json`` and one results file per mode and
experiment (``loadlab report <out>/chunked-interference.json`` reads any of them).
"""

from __future__ import annotations

import argparse
import json

from loadlab.errors import ConfigError
from loadlab.extras import require
from loadlab.report.output import check_folder

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--preset", default="cpu", help="cpu (default), tiny or 1b (one GPU)")
    a("--modes", default="static,continuous,chunked,disaggregated", help="comma-separated")
    a("--duration", type=float, metavar="S", help="interference experiment length in seconds")
    a("--baseline", type=float, metavar="S", help="baseline (no long prompts) length in seconds")
    a("--long-every", type=float, metavar="S", help="seconds between long prompts")
    a("--long-prompt-tokens", type=int, metavar="N", help="long prompt length")
    a("--streams", type=int, metavar="N", help="steady chat streams")
    a("--chunk-size", type=int, metavar="N", help="chunked mode: longest prompt slice")
    a("--max-batched-tokens", type=int, metavar="N", help="chunked mode: tokens per step")
    a("--threads", type=int, metavar="N", help="server torch threads (cpu default 1)")
    a("--seed", type=int, help="workload seed")
    a("--out", default="reports/lab", metavar="DIR", help="output folder (default reports/lab)")
    a("--quick", action="store_true", help="tiny preset, a few seconds per experiment (tests)")


def run(args: argparse.Namespace) -> int:
    require("server", "the lab (the reference server in four modes)")
    from loadlab.lab import (
        ALL_MODES,
        lab_summary,
        render_html,
        render_markdown,
        run_lab,
        settings_for,
    )

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ALL_MODES]
    if bad or not modes:
        raise ConfigError(f"--modes takes {','.join(ALL_MODES)}; got {args.modes!r}")
    s = settings_for(
        args.preset,
        args.quick,
        duration_s=args.duration,
        baseline_s=args.baseline,
        long_every_s=args.long_every,
        long_prompt_tokens=args.long_prompt_tokens,
        streams=args.streams,
        chunk_size=args.chunk_size,
        max_batched_tokens=args.max_batched_tokens,
        threads=args.threads,
        seed=args.seed,
    )
    out = check_folder(args.out, "--out")  # before the minutes of running, not after
    outcome = run_lab(s, modes, out, overlap_batching=args.quick)
    summary = lab_summary(outcome, s)
    (out / "lab.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    md = render_markdown(summary)
    (out / "lab.md").write_text(md, encoding="utf-8")
    (out / "lab.html").write_text(render_html(summary), encoding="utf-8")
    print(md)
    print(f"report: {out / 'lab.md'}, {out / 'lab.html'}; data: {out / 'lab.json'}")
    return 0 if outcome.results else 1
