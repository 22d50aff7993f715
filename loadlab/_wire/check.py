"""``loadlab selftest --wire``: loadlab's own timing error on the user's endpoint, judged by
the kernel's packet timestamps.

    loadlab selftest --wire --endpoint http://127.0.0.1:8000 --model M \\
        [--concurrency 8 --requests 200 --prompt-tokens 256 --max-tokens 64]

The load runs as ``loadlab run`` would send it (closed loop, the synthetic workload) while
``loadlab._wire.capture`` records every packet to and from the endpoint's port; afterwards the
TCP streams are rebuilt, every exchange read and joined to its record by the
``X-Request-Id`` loadlab sends, and ``loadlab._wire.judge`` prints loadlab's TTFT, ITL and E2E
minus the wire's at p50, p90 and p99 with the verdict against the claim (within 1 ms at p50
and p90, 2 ms at p99). The results file is the run's, with an ``extra.wire`` section: the
capture's counts, the clock offsets, the figures and, per request, the wire's times on the
run's clock (``sent_ns`` = the request's last byte, ``headers_ns``, ``chunk_ns`` = token
events, ``end_ns``; ns from ``t0``, as the records).

An ``https://`` endpoint is encrypted on the wire: the capture gives packet times only (the
gaps between the server's data packets, beside loadlab's ITL), and nothing is judged.

Exit 0 within the claim, 1 not (or not judged), 2 bad input or no CAP_NET_RAW.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loadlab._analysis.metrics import distribution
from loadlab._report.output import check_output, write_output
from loadlab._wire.capture import Capture, CaptureResult, check_capture
from loadlab._wire.clock import ClockMap
from loadlab._wire.http import Exchange, read_exchanges
from loadlab._wire.judge import CLAIM_MS, answered, judge, record_timings, render, wire_timings
from loadlab._wire.tcp import Streams
from loadlab.config import APIS, EndpointConfig, RunConfig, extra_body_from_flag
from loadlab.errors import ConfigError
from loadlab.results import Results, write_results

__all__ = ["add_wire_arguments", "run_command", "run_wire_check", "wire_section"]

# the load when a flag is not given: the side-by-side's (256 in, 64 out, 8 streams)
DEFAULTS = {"concurrency": 8, "requests": 200, "prompt_tokens": 256, "max_tokens": 64}

# selftest flags that belong to the fixed-server self-test, not to --wire
FIXED_ONLY = (
    *("levels", "requests_per_stream", "ttft_ms", "itl_ms", "tokens", "workers"),
    *("ttft_tol_ms", "itl_tol_ms"),
)
WIRE_ONLY = (
    *("endpoint", "model", "api", "api_key_env", "concurrency", "requests"),
    *("prompt_tokens", "max_tokens", "extra_body", "tolerance_ms", "interface", "pcap"),
)


def add_wire_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "the wire check (--wire): your endpoint, judged by a packet capture (root or CAP_NET_RAW)"
    )
    a = g.add_argument
    a("--wire", action="store_true", help="check loadlab against the kernel's packet times")
    a("--endpoint", metavar="URL", help="the server's base URL, e.g. http://127.0.0.1:8000")
    a("--model", help="model name sent in each request")
    a("--api", choices=list(APIS), help="API flavour (default chat)")
    a("--api-key-env", metavar="VAR", help="environment variable holding the API key")
    a("--concurrency", type=int, metavar="C", help="concurrent streams (default 8)")
    a("--requests", type=int, metavar="N", help="requests (default 200)")
    a("--prompt-tokens", type=int, metavar="P", help="prompt length in tokens (default 256)")
    a("--max-tokens", type=int, metavar="M", help="output tokens asked per request (default 64)")
    a("--extra-body", metavar="JSON", help="extra request fields, e.g. '{\"ignore_eos\": true}'")
    a(
        "--tolerance-ms",
        metavar="P50,P90,P99",
        help="judge |loadlab - wire| against these instead of loadlab's claim (1,1,2)",
    )
    a("--interface", metavar="IF", help="capture on this interface only (default: all)")
    a(
        "--pcap",
        metavar="FILE",
        help="keep the capture here (pcap, ns timestamps; mode 0600: it holds every byte sent, "
        "API key and prompts included)",
    )


def _check_flags(args: argparse.Namespace) -> None:
    given = [f for f in WIRE_ONLY if getattr(args, f, None) is not None]
    if not args.wire:
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ConfigError(f"{flag} belongs to the wire check: add --wire")
        return
    if not args.endpoint:
        raise ConfigError("--wire needs --endpoint URL (the server to run the load against)")
    for f in FIXED_ONLY:
        if getattr(args, f, None) is not None:
            flag = "--" + f.replace("_", "-")
            raise ConfigError(f"{flag} sets the fixed-schedule server's self-test, not --wire")
    if args.preset != "default":
        raise ConfigError("--preset sets the fixed-schedule server's self-test, not --wire")


def claims_from_args(args: argparse.Namespace) -> dict[int, float]:
    """``--tolerance-ms P50,P90,P99``, else loadlab's claim (``CLAIM_MS``)."""
    if not args.tolerance_ms:
        return dict(CLAIM_MS)
    try:
        values = [float(x) for x in args.tolerance_ms.split(",")]
    except ValueError:
        values = []
    if len(values) != len(CLAIM_MS) or min(values) < 0:
        raise ConfigError(
            f"--tolerance-ms takes three numbers >= 0 (ms at p50, p90, p99), e.g. 1,1,2; "
            f"got {args.tolerance_ms!r}"
        )
    return dict(zip(CLAIM_MS, values, strict=True))


def config_from_args(args: argparse.Namespace) -> tuple[RunConfig, EndpointConfig]:
    ep: dict[str, Any] = {"url": args.endpoint, "name": "wire"}
    for flag in ("model", "api", "api_key_env"):
        if getattr(args, flag) is not None:
            ep[flag] = getattr(args, flag)
    endpoint = EndpointConfig(**ep)
    extra = extra_body_from_flag(args.extra_body) if args.extra_body else {}
    given = {
        "concurrency": args.concurrency,
        "requests": args.requests,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
    }
    for name, value in given.items():
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    load = {k: v if v is not None else DEFAULTS[k] for k, v in given.items()}
    cfg = RunConfig(
        endpoints=(endpoint,),
        concurrency=load["concurrency"],
        requests=load["requests"],
        prompt_tokens=load["prompt_tokens"],
        max_tokens=load["max_tokens"],
        extra_body=extra,
        progress=False,
    )
    return cfg, endpoint


def _addresses(host: str, port: int) -> set[str]:
    try:
        return {str(a[4][0]) for a in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except socket.gaierror as exc:
        raise ConfigError(f"--endpoint: cannot resolve {host!r} ({exc})") from exc


def run_wire_check(
    cfg: RunConfig,
    endpoint: EndpointConfig,
    *,
    interface: str | None = None,
    pcap: str | Path | None = None,
    claims: Mapping[int, float] = CLAIM_MS,
    say: Callable[[str], None] = print,
) -> Results:
    """Run ``cfg`` against ``endpoint`` while capturing; the run's results with ``extra.wire``
    (``wire_section``), judged against ``claims`` (ms at each percentile). Raises
    ``ConfigError`` without CAP_NET_RAW, before any request."""
    from loadlab._runner.run import run_specs
    from loadlab.workloads import build_requests

    u = urlsplit(endpoint.url)
    tls = u.scheme == "https"
    port = u.port or (443 if tls else 80)
    servers = _addresses(u.hostname or "", port)
    check_capture(interface)
    cap = Capture(port, interface, pcap)
    try:
        say(f"capturing TCP port {port} on {interface or 'every interface'} ...")
        with cap:
            res = run_specs(cfg, endpoint, build_requests, kind="selftest")
        if cap.result is None or cap.clock is None:
            raise RuntimeError("the packet capture ended without its counts")
        streams, exs = read_exchanges(cap.result.pcap, port, servers)
        res.extra["wire"] = wire_section(
            res, streams, exs, cap.result, cap.clock, tls=tls, claims=claims
        )
    finally:
        if pcap is None:
            cap.cleanup()
    return res


def _capture_counts(cap: CaptureResult, streams: Streams) -> dict[str, Any]:
    return {
        "interface": cap.interface,
        "port": cap.port,
        "packets": cap.packets,
        "dropped": cap.dropped,
        "unstamped": cap.unstamped,
        "truncated": cap.truncated,
        "connections": len(streams.connections),
        "connections_partial": streams.partial,
        "connections_with_gaps": sum(
            not (c.to_server.complete and c.to_client.complete) for c in streams.connections
        ),
    }


def wire_section(
    res: Results,
    streams: Streams,
    exs: list[Exchange],
    cap: CaptureResult,
    clock: ClockMap,
    *,
    tls: bool,
    claims: Mapping[int, float] = CLAIM_MS,
) -> dict[str, Any]:
    """The results file's ``extra.wire``: counts, clock, figures and per-request wire times."""
    section: dict[str, Any] = {
        "tls": tls,
        "capture": _capture_counts(cap, streams),
        "clock": clock.to_dict(),
    }
    if tls:
        gaps = [
            (b - a) / 1e6
            for c in streams.connections
            for a, b in zip(c.to_client.times, c.to_client.times[1:], strict=False)
        ]
        d = distribution(gaps, (50.0, 90.0, 99.0))
        section["server_packet_gap_ms"] = {f"p{p}": d.at(p) for p in (50, 90, 99)}
        section["within_claim"] = None
        return section
    fig = judge(record_timings(res.records), wire_timings(exs), claims)
    t0 = int(res.extra.get("t0_ns") or 0)
    section.update(
        exchanges=len(exs),
        figures=fig,
        within_claim=fig["within_claim"],
        truth=_truth(answered(exs).items(), clock, t0),
    )
    return section


def _truth(
    items: Iterable[tuple[str, Exchange]], clock: ClockMap, t0: int
) -> dict[str, dict[str, Any]]:
    def rel(t: int | None) -> int | None:
        return None if t is None else clock.to_perf_ns(t) - t0

    return {
        rid: {
            "sent_ns": rel(ex.request_last_ns),
            "headers_ns": rel(ex.headers_ns),
            "chunk_ns": [rel(t) for t in ex.times()],
            "end_ns": rel(ex.end_ns),
        }
        for rid, ex in items
    }


def render_section(section: dict[str, Any], records: Collection[Any]) -> str:
    """What ``selftest --wire`` prints after the run."""
    c, clk = section["capture"], section["clock"]
    lines = [
        f"capture: {c['packets']:,} packets on {c['interface']}, port {c['port']}; "
        f"{c['connections']} connections; kernel drops {c['dropped']}; clock drift during the "
        f"run {clk['drift_ns'] / 1e3:+.1f} us (offset sampled within {clk['uncertainty_ns']} ns)"
    ]
    if section["tls"]:
        from loadlab._analysis.metrics import itl_ms

        d = distribution([g for r in records for g in itl_ms(r)], (50.0, 90.0, 99.0))
        gaps = section["server_packet_gap_ms"]
        lines += [
            "https: the stream is encrypted on the wire, so it gives packet times only: "
            "TTFT, ITL and E2E are not judged",
            f"server data packet gaps p50/p90/p99 ms: {_trio(gaps)}; loadlab ITL: "
            f"{_trio({f'p{p}': d.at(p) for p in (50, 90, 99)})}",
            "verdict: not judged (use the engine's plain http:// address to judge)",
        ]
        return "\n".join(lines)
    lines.append(render(section["figures"]))
    if c["dropped"] or c["connections_with_gaps"]:
        lines.append(
            f"the wire is partial: the kernel dropped {c['dropped']} packets; "
            f"{c['connections_with_gaps']} connections have a gap (their later requests left out)"
        )
    lines.append(f"verdict: {'within the claim' if section['within_claim'] else 'NOT within it'}")
    return "\n".join(lines)


def _trio(d: dict[str, float | None]) -> str:
    return " / ".join("-" if d[k] is None else f"{d[k]:.2f}" for k in ("p50", "p90", "p99"))


def run_command(args: argparse.Namespace) -> int:
    """``loadlab selftest --wire ...`` (the flags of ``add_wire_arguments``)."""
    _check_flags(args)
    cfg, endpoint = config_from_args(args)
    claims = claims_from_args(args)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = Path(args.out) if args.out else Path("reports") / f"selftest-wire-{stamp}.json"
    check_output(path, "--out")
    if args.pcap:
        check_output(args.pcap, "--pcap")

    def say(s: str) -> None:
        print(s, file=sys.stderr)

    say(
        f"loadlab selftest --wire: {endpoint.url}, {cfg.concurrency} streams, {cfg.requests} "
        f"requests, {cfg.prompt_tokens} tokens in, {cfg.max_tokens} out"
    )
    res = run_wire_check(
        cfg, endpoint, interface=args.interface, pcap=args.pcap, claims=claims, say=say
    )
    write_output(path, "--out", lambda p: write_results(res, p))
    section = res.extra["wire"]
    print(render_section(section, res.records))
    failed = sum(not r.ok for r in res.records)
    if failed:
        print(f"{failed} of {len(res.records)} requests failed (left out of the comparison)")
    if res.saturated:
        lag = res.generator.get("loop_lag_ms_p99")
        print(
            f"GENERATOR SATURATED (loop lag p99 {lag or 0:.1f} ms): loadlab waited for a CPU, "
            "and read late what the wire shows arriving on time; give it a core of its own"
        )
    print(f"results: {path}")
    return 0 if section["within_claim"] else 1
