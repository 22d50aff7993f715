"""``loadlab selftest``: measure this generator's own timing error against a fixed-schedule
server whose chunk write times are the truth (see ``loadlab.selftest._accuracy`` for the definitions).

    loadlab selftest                       # rising load: 1, 16, 64, 128, 256 streams
    loadlab selftest --preset streams64    # 64 streams, TTFT 100 ms, ITL 20 ms, 64 tokens, 640 requests
    loadlab selftest --preset streams256   # 256 streams at 5 ms ITL, two loadlab processes
    loadlab selftest --levels 1,32 --ttft-ms 20 --itl-ms 5 --tokens 32
    loadlab selftest --wire --endpoint http://127.0.0.1:8000 --model M   # your server, judged
                                           # by the kernel's packet times (loadlab._wire.check)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from datetime import UTC, datetime
from pathlib import Path

from loadlab._report.output import check_output, write_output
from loadlab._wire.check import WIRE_ONLY, add_wire_arguments, run_command
from loadlab.errors import ConfigError
from loadlab.results import write_results
from loadlab.selftest._accuracy import (
    PRESETS,
    SelftestConfig,
    preset_name,
    render_levels,
    run_selftest,
)

__all__ = ["add_arguments", "config_from_args", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a(
        "--preset",
        choices=sorted(PRESETS),
        type=preset_name,
        default="default",
        help="a named load (default: default)",
    )
    a("--levels", metavar="C,C,...", help="concurrent streams per level, e.g. 1,16,64")
    a("--requests-per-stream", type=int, metavar="N", help="requests per level = streams x N")
    a("--ttft-ms", type=float, help="the server's time to first token")
    a("--itl-ms", type=float, help="the server's gap between tokens")
    a("--tokens", type=int, help="output tokens per request")
    a(
        "--workers",
        type=int,
        help="loadlab processes (the server runs in one more; default 1, 2 for --preset streams256)",
    )
    a("--ttft-tol-ms", type=float, help="tolerance on the TTFT error p99")
    a("--itl-tol-ms", type=float, help="tolerance on the ITL p99 error")
    a("--out", metavar="FILE", help="results file (default reports/selftest-<UTC time>.json)")
    add_wire_arguments(p)


def config_from_args(args: argparse.Namespace) -> SelftestConfig:
    base = PRESETS[args.preset]
    changes: dict[str, object] = {}
    if args.levels:
        try:
            changes["levels"] = tuple(int(x) for x in args.levels.split(",") if x.strip())
        except ValueError as exc:
            raise ConfigError(
                f"--levels must be comma-separated integers, got {args.levels!r}"
            ) from exc
    for flag, name in (
        ("requests_per_stream", "requests_per_stream"),
        ("ttft_ms", "ttft_ms"),
        ("itl_ms", "itl_ms"),
        ("tokens", "tokens"),
        ("workers", "workers"),
        ("ttft_tol_ms", "ttft_tol_ms"),
        ("itl_tol_ms", "itl_tol_ms"),
    ):
        value = getattr(args, flag)
        if value is not None:
            changes[name] = value
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def run(args: argparse.Namespace) -> int:
    if args.wire or any(getattr(args, f) is not None for f in WIRE_ONLY):
        return run_command(args)  # the user's endpoint, judged by a packet capture
    sc = config_from_args(args)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = Path(args.out) if args.out else Path("reports") / f"selftest-{stamp}.json"
    check_output(path, "--out")  # before the minutes of measuring, not after
    print(
        f"loadlab selftest ({args.preset}): server TTFT {sc.ttft_ms:g} ms, ITL {sc.itl_ms:g} ms, "
        f"{sc.tokens} tokens; loadlab workers {sc.workers}",
        file=sys.stderr,
    )
    results = run_selftest(sc, say=lambda s: print(s, file=sys.stderr))
    write_output(path, "--out", lambda p: write_results(results, p))
    levels = results.extra["levels"]
    print(render_levels(levels))
    best = results.extra["highest_within_tolerance"]
    tol = f"TTFT err p99 <= {sc.ttft_tol_ms:g} ms, tok/s within {100 * sc.tps_tol:g}%"
    if sc.itl_tol_ms is not None:
        tol += f", ITL p99 err <= {sc.itl_tol_ms:g} ms"
    if sc.min_server_tps is not None:
        tol += f", server >= {sc.min_server_tps:,.0f} tok/s"
    print(f"tolerance: {tol}")
    print(f"highest load within tolerance: {f'{best} streams' if best else 'none'}")
    print(f"results: {path}")
    from loadlab._commands.run import warn

    for lv in levels:
        if lv.get("busy"):
            warn(f"the machine was busy at {lv['streams']} streams ({'; '.join(lv['busy'])}): "
                 "those figures are the machine's as much as loadlab's; run again when it is quiet")  # fmt: skip
    saturated = [lv for lv in levels if lv["saturated"]]
    if saturated:
        streams = ", ".join(str(lv["streams"]) for lv in saturated)
        busy = any((lv.get("cpu_percent_mean") or 0.0) >= 50.0 * sc.workers for lv in saturated)
        cause = (
            f"loadlab's CPU was the limit: try --workers {sc.workers + 1}"
            if busy
            else "loadlab itself was mostly idle: other processes kept it waiting for a CPU"
        )
        warn(f"GENERATOR SATURATED at {streams} streams (see the lag column); {cause}")
    return 0 if levels[0]["within_tolerance"] else 1
