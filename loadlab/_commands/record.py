"""``loadlab record``: a reverse proxy that writes the shape of the traffic passing through it.

    loadlab record --listen 127.0.0.1:9000 --upstream http://127.0.0.1:8000 --out trace.jsonl
    loadlab record ... --tokenizer path/to/tokenizer.json --block 16   # hashes in tokens
    loadlab run --scenario S --endpoint http://127.0.0.1:9000 ...       # traffic goes through it
    loadlab report trace.jsonl                                          # what was recorded
    loadlab run --endpoint URL --workload-file ... kind = "trace", path = "trace.jsonl"  # replay

Point clients at ``--listen`` instead of the upstream. Requests and answers pass through byte for
byte (hop-by-hop headers aside), except: a stream that did not ask for usage is asked for it,
and the usage-only event that adds is taken out before the client sees it (``--no-ask-usage``
sends the request unchanged, and such a trace has no token counts for those requests). No
prompt or answer text, no header, no key and no client address is written (docs/record.md).
Stops on Ctrl-C / SIGTERM, or after ``--duration`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path

from loadlab.errors import ConfigError

__all__ = ["add_arguments", "parse_listen", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a(
        "--listen",
        default="127.0.0.1:9000",
        metavar="HOST:PORT",
        help="where clients connect (default: %(default)s)",
    )
    a("--upstream", required=True, metavar="URL", help="the server the traffic goes to")
    a("--out", required=True, type=Path, metavar="FILE", help="the trace file (JSON lines)")
    a(
        "--block",
        type=int,
        default=16,
        metavar="N",
        help="prompt block size for the hashes, in characters (tokens with --tokenizer; "
        "default: %(default)s)",
    )
    a("--tokenizer", metavar="PATH", help="the upstream model's tokenizer: hash in its tokens")
    a(
        "--no-ask-usage",
        action="store_true",
        help="never add stream_options.include_usage to a stream that lacks it",
    )
    a("--force", action="store_true", help="overwrite --out if it exists")
    a("--duration", type=float, metavar="S", help="stop after S seconds")


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
        raise ConfigError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9000")
    return host.strip("[]"), int(port)


def run(args: argparse.Namespace) -> int:
    from loadlab._headers import public_url, split_userinfo

    host, port = parse_listen(args.listen)
    upstream, _auth = split_userinfo(args.upstream)
    if not upstream.startswith(("http://", "https://")):
        raise ConfigError(f"--upstream {public_url(args.upstream)!r}: expected http:// or https://")
    if args.block < 1 or args.block > 65536:
        raise ConfigError(f"--block must be 1..65536, got {args.block}")
    if args.duration is not None and not args.duration > 0:
        raise ConfigError(f"--duration must be > 0, got {args.duration}")
    if args.out.exists() and not args.force:
        raise ConfigError(f"--out {args.out} exists; give another path or --force")
    if args.out.is_dir() or not args.out.parent.is_dir():
        raise ConfigError(f"--out {args.out}: not a file in an existing folder")
    from loadlab._runner.runner import run_async  # uvloop where installed

    return run_async(_serve(args, host, port, upstream))


async def _serve(args: argparse.Namespace, host: str, port: int, upstream: str) -> int:
    from loadlab._headers import public_url
    from loadlab._record.handoff import TraceChild
    from loadlab._record.proxy import RecordingProxy

    header = {
        "unit": "tokens" if args.tokenizer else "chars",
        "block": args.block,
        "asked_usage": not args.no_ask_usage,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    tracer = TraceChild(args.out, header, block=args.block, tokenizer=args.tokenizer)
    proxy = RecordingProxy(upstream, tracer, ask_usage=not args.no_ask_usage)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        bound = await proxy.start(host, port)  # ConfigError: the trace writer cannot start
    except OSError as exc:
        raise ConfigError(f"--listen {host}:{port}: cannot listen ({exc.strerror})") from None
    # what start-up made (modules, the event loop) lives as long as the process: moved out of
    # the collector's sight, a full collection no longer pauses every stream to walk it
    gc.collect()
    gc.freeze()
    print(
        f"recording: http://{host}:{bound} -> {public_url(upstream)}; trace: {args.out}", flush=True
    )
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), args.duration)
    await proxy.stop()
    lost = tracer.lost
    print(
        f"recorded {tracer.written} request(s) to {args.out}"
        + (f"; {lost} trace line(s) lost ({tracer.why()})" if lost else "")
        + (f"; the trace is incomplete: its writer {tracer.died}" if tracer.died else "")
        + (
            f"; upstream unreachable {proxy.upstream_failures} time(s)"
            if proxy.upstream_failures
            else ""
        ),
        file=sys.stderr,
        flush=True,
    )
    return 1 if lost or tracer.died else 0
