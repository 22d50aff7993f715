"""``loadlab lab``: start the reference server in each mode and show the modes side by side.

    loadlab lab                                  # cpu preset, all four modes, 3 rounds (7 min at load 11)
    loadlab lab --quick                          # tiny preset, seconds (what the tests run)
    loadlab lab --preset 1b --out reports/lab-gpu   # one GPU
    loadlab lab --modes continuous,chunked --duration 60
    loadlab lab --prefix-cache [--quick]         # only the prefix-cache experiment

Writes ``<out>/lab.md``, ``lab.html``, ``lab.json`` and one results file per mode, experiment
and round (``loadlab report <out>/chunked-interference-r1.json`` reads any of them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from loadlab._report.output import check_folder
from loadlab.errors import ConfigError, require
from loadlab.records import pick

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--preset", default="cpu", help="cpu (default), tiny or 1b (one GPU)")
    a("--modes", default="static,continuous,chunked,disaggregated", help="comma-separated")
    a("--rounds", type=int, metavar="N", help="rounds, each visiting every mode (cpu default 3)")
    # the flags from --rounds to --seed set the LabSettings field named by their dest
    a("--duration", dest="duration_s", type=float, metavar="S",
      help="interference experiment per round (seconds)")  # fmt: skip
    a("--baseline", dest="baseline_s", type=float, metavar="S",
      help="baseline (no long prompts) per round (seconds)")  # fmt: skip
    a("--long-every", dest="long_every_s", type=float, metavar="S",
      help="seconds between long prompts")  # fmt: skip
    a("--long-prompt-tokens", type=int, metavar="N", help="long prompt length")
    a("--streams", type=int, metavar="N", help="steady chat streams")
    a("--chunk-size", type=int, metavar="N", help="chunked mode: longest prompt slice")
    a("--max-batched-tokens", type=int, metavar="N", help="chunked mode: tokens per step")
    a("--threads", type=int, metavar="N", help="server torch threads (cpu default 1)")
    a("--seed", type=int, help="workload seed")
    a("--out", default="reports/lab", metavar="DIR", help="output folder (default reports/lab)")
    a("--quick", action="store_true", help="tiny preset, a few seconds per experiment (tests)")
    a("--prefix-cache", action="store_true",
      help="only the prefix-cache experiment: TTFT by prefix length on/off, throughput by hit rate")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    require("server", "the lab (the reference server in four modes)")
    from loadlab._lab import (
        ALL_MODES,
        lab_summary,
        render_html,
        render_markdown,
        run_lab,
        settings_for,
    )

    if args.prefix_cache:
        return _prefix_cache(args)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ALL_MODES]
    if bad or not modes:
        raise ConfigError(f"--modes takes {','.join(ALL_MODES)}; got {args.modes!r}")
    overrides = pick(args, "rounds duration_s baseline_s long_every_s long_prompt_tokens streams "
                           "chunk_size max_batched_tokens threads seed")  # fmt: skip
    s = settings_for(args.preset, args.quick, **overrides)
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


def _prefix_cache(args: argparse.Namespace) -> int:
    from loadlab._lab.prefix import prefix_lab, prefix_settings

    out = Path(args.out)
    data = prefix_lab(prefix_settings(args.preset, args.quick), out)
    print((out / "prefix.md").read_text(encoding="utf-8"))
    print(f"report: {out / 'prefix.md'}; data: {out / 'prefix.json'}")
    return 0 if data["ttft"] else 1
