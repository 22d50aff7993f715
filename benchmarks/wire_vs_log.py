"""The wire against a known truth: the fixed-schedule server's own write log.

    sudo python3 benchmarks/wire_vs_log.py [--levels 1,16,64] [--requests-per-stream 4]

``python -m loadlab.selftest`` stamps ``perf_counter_ns`` just before it hands each chunk
to the socket. At each level (concurrent streams) a fresh server runs in its own process and
``loadlab selftest --wire``'s machinery (``loadlab._wire.check.run_wire_check``) drives it while
capturing the loopback; every token event on the wire is then held against the server's stamp
for the same chunk (the capture's CLOCK_REALTIME mapped onto CLOCK_MONOTONIC). The wire can
only be later than the stamp (the write follows it); how much later is the capture's error
plus the server's own time from its stamp to the kernel.

Printed per level: chunks compared, wire minus log at p50 / p90 / p99 / max (ms), the packets
the kernel dropped, and beside them loadlab's TTFT and ITL p99 minus the wire's. Target: wire
minus log within 0.2 ms at p99 at every level, every chunk found, no drop; exit 1 otherwise.
Needs root or CAP_NET_RAW. ``--json FILE`` keeps every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadlab._analysis.metrics import distribution
from loadlab._wire.capture import check_capture
from loadlab._wire.check import run_wire_check
from loadlab.config import EndpointConfig, RunConfig
from loadlab.selftest import FixedServerProcess

TARGET_P99_MS = 0.2


def level(streams: int, args: argparse.Namespace) -> dict[str, Any]:
    with FixedServerProcess(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens=args.tokens) as url:
        ep = EndpointConfig(url=url, name="fixed", model="loadlab-fixed")
        cfg = RunConfig(
            endpoints=(ep,),
            concurrency=streams,
            requests=streams * args.requests_per_stream,
            prompt_tokens=16,
            max_tokens=args.tokens,
            progress=False,
        )
        res = run_wire_check(cfg, ep, say=lambda _s: None)
        with urllib.request.urlopen(url + "/truth", timeout=30) as resp:  # noqa: S310 - loopback
            truth = json.loads(resp.read())
    wire, t0 = res.extra["wire"], int(res.extra["t0_ns"])
    gaps, missing = [], 0
    for rid, logged in truth.items():
        seen = wire["truth"].get(rid)
        if seen is None or len(seen["chunk_ns"]) != len(logged["chunk_ns"]):
            missing += 1
            continue
        gaps += [
            (w + t0 - s) / 1e6 for w, s in zip(seen["chunk_ns"], logged["chunk_ns"], strict=True)
        ]
    d = distribution(gaps, (50.0, 90.0, 99.0))
    fig = wire["figures"]["metrics"]
    return {
        "streams": streams,
        "requests": len(truth),
        "chunks": len(gaps),
        "requests_missing": missing,
        "wire_minus_log_ms": {"p50": d.at(50), "p90": d.at(90), "p99": d.at(99), "max": d.max},
        "dropped": wire["capture"]["dropped"],
        "loadlab_ttft_p99_minus_wire_ms": fig["ttft"]["diff_ms"]["p99"],
        "loadlab_itl_p99_minus_wire_ms": fig["itl"]["diff_ms"]["p99"],
        "loadlab_saturated": res.saturated,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--levels", default="1,16,64", help="concurrent streams, comma-separated")
    p.add_argument("--requests-per-stream", type=int, default=4)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args()
    check_capture()
    rows, ok = [], True
    print(f"{'streams':>7} {'chunks':>7}  {'wire - log ms p50 / p90 / p99 / max':>38}  drops  "
          f"{'loadlab - wire p99 ms: TTFT / ITL':>34}")  # fmt: skip
    for streams in (int(x) for x in args.levels.split(",") if x.strip()):
        row = level(streams, args)
        rows.append(row)
        e = row["wire_minus_log_ms"]
        cells = " / ".join(
            f"{e[k]:.3f}" if e[k] is not None else "-" for k in ("p50", "p90", "p99", "max")
        )
        ours = f"{row['loadlab_ttft_p99_minus_wire_ms']:+.3f} / {row['loadlab_itl_p99_minus_wire_ms']:+.3f}"
        sat = "  (loadlab saturated)" if row["loadlab_saturated"] else ""
        print(
            f"{streams:>7} {row['chunks']:>7}  {cells:>38}  {row['dropped']:>5}  {ours:>34}{sat}",
            flush=True,
        )
        ok &= (
            row["requests_missing"] == 0
            and row["dropped"] == 0
            and e["p99"] is not None
            and e["p99"] <= TARGET_P99_MS
        )
    print(f"target: wire - log p99 <= {TARGET_P99_MS} ms at every level, every chunk, no drop")
    print(f"load average after: {Path('/proc/loadavg').read_text().strip()}")
    print("PASS" if ok else "FAIL")
    if args.json:
        args.json.write_text(json.dumps({"levels": rows, "passed": ok}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
