"""``loadlab-server``: the reference server's command line.

Usage::

    loadlab-server --mode continuous --preset cpu --port 8000
    loadlab-server --mode chunked --preset tiny --max-batched-tokens 512 --chunk-size 256
    loadlab-server --prefix-caching off     # recompute every prompt (caching is on by default)
    LOADLAB_KEY=s3cret loadlab-server --api-key-env LOADLAB_KEY
    LOADLAB_KEY=s3cret loadlab-server --host 0.0.0.0 --api-key-env LOADLAB_KEY  # beyond loopback

An address beyond loopback needs ``--api-key-env`` (or ``--allow-unauthenticated``, said on
purpose). A connection whose request has not arrived whole ``--request-read-timeout`` seconds
after it opened (or after its previous answer) is closed (``reference_server.deadline``).

It prints ``loadlab-server ready: http://127.0.0.1:8000 ...`` once it accepts requests.
"""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

# The server extra, checked before it is imported: without it ``loadlab-server`` says what to
# install (exit 2) instead of a traceback ending in "No module named 'uvicorn'".
_MISSING = [m for m in ("torch", "fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
if _MISSING:
    print(
        f"loadlab-server: needs the 'server' extra, and {', '.join(_MISSING)} is not installed; "
        'install it with: pip install torch==2.13.0 "loadlab[server]" (CPU torch; on a GPU '
        "machine install the torch you want first and drop the pin)",
        file=sys.stderr,
    )
    raise SystemExit(2)

import uvicorn  # noqa: E402 - after the check above

from reference_server.api import ServerSettings, create_app  # noqa: E402
from reference_server.config import ServerConfig  # noqa: E402
from reference_server.deadline import with_request_deadline  # noqa: E402
from reference_server.engine import Engine  # noqa: E402
from reference_server.engine_like import EngineLike  # noqa: E402
from reference_server.kv_cache import BlockManager  # noqa: E402
from reference_server.scheduler import MODES, make_scheduler  # noqa: E402
from reference_server.scheduler.static import FINISHED_SLOTS  # noqa: E402

__all__ = ["build_app", "main", "parse_args"]


def parse_args(argv: Sequence[str] | None = None) -> ServerConfig:
    """``loadlab-server`` flags -> ``ServerConfig`` (exits with a usage message on bad flags)."""
    p = argparse.ArgumentParser(prog="loadlab-server", description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=sorted([*MODES, "disaggregated"]), default="continuous")
    p.add_argument(
        "--preset",
        default="cpu",
        help="tiny (tests), cpu, 1b (one GPU); fake = no model, for development",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model-name", default="loadlab-ref", help="the name clients send as 'model'")
    p.add_argument("--max-num-seqs", type=int, default=32, help="largest running batch")
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--kv-cache-mb", type=float, help="KV cache budget in MiB")
    kv.add_argument("--num-kv-blocks", type=int, help="KV cache size in blocks")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument(
        "--prefix-caching",
        choices=("on", "off"),
        default="on",
        help="reuse the KV blocks of prompt prefixes seen before (default on, as vLLM); in "
        "disaggregated mode the prefill workers cache them",
    )
    p.add_argument("--max-model-len", type=int, help="cap the context (default: the model's)")
    p.add_argument("--max-batched-tokens", type=int, help="tokens per step (chunked: default 512)")
    p.add_argument("--chunk-size", type=int, default=256, help="longest prompt slice (chunked)")
    p.add_argument(
        "--static-finished",
        choices=FINISHED_SLOTS,
        default="pad",
        help="static: a finished member's row keeps running as padding until its batch ends "
        "(pad, as a padded generate() call) or leaves the forward pass (idle)",
    )
    p.add_argument(
        "--max-queue", type=int, default=1024, help="waiting requests beyond the batch before 429"
    )
    p.add_argument("--api-key-env", help="name of an environment variable holding the API key")
    p.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve an address beyond loopback (--host) without --api-key-env: anyone who can "
        "reach it may use it",
    )
    p.add_argument(
        "--request-read-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="close a connection whose request (headers and body) has not arrived whole S "
        "seconds after it opened or after its previous answer (default 30)",
    )
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0, help="weight seed (and the tool-call draw's)")
    a = p.add_argument_group("reasoning model and tool calls (reference_server.answer)")
    a.add_argument("--reasoning-tokens", type=int, default=0,
                   help="the first N tokens of each answer go out as reasoning (default 0)")  # fmt: skip
    a.add_argument("--tool-call-rate", type=float, default=0.5,
                   help="of requests that offer tools, the share whose answer is a tool call")  # fmt: skip
    p.add_argument("--log-level", default="warning")
    d = p.add_argument_group("disaggregated mode")
    d.add_argument("--prefill-workers", type=int, default=1, help="prefill worker processes")
    d.add_argument("--decode-workers", type=int, default=1, help="decode worker processes")
    d.add_argument(
        "--prefill-cpus", help="CPUs of the prefill pool, e.g. 0 or 0-3 (default: first half)"
    )
    d.add_argument("--decode-cpus", help="CPUs of the decode pool, e.g. 1 (default: the rest)")
    d.add_argument(
        "--prefill-nice",
        type=int,
        help="nice increment of the prefill workers (default 10 on CPU, 0 on GPU): where the "
        "prefill pool shares cores with the API process and the load generator, their token "
        "delivery goes first, as if prefill had its own machine",
    )
    d.add_argument(
        "--max-held",
        type=int,
        help="requests a prefill worker holds for pulling (default max-num-seqs)",
    )
    d.add_argument(
        "--dist-init", help="torch.distributed init_method (default tcp://127.0.0.1:<free port>)"
    )
    args = p.parse_args(argv)
    if args.api_key_env and not os.environ.get(args.api_key_env):
        p.error(f"--api-key-env {args.api_key_env}: that environment variable is empty or unset")
    wait_s = args.request_read_timeout
    if not 0 < wait_s <= 86_400:  # also refuses nan and inf
        p.error(f"--request-read-timeout must be > 0 and <= 86400 seconds, got {wait_s}")
    if not _loopback(args.host) and not args.api_key_env:
        if not args.allow_unauthenticated:
            p.error(
                f"--host {args.host} serves beyond this machine, and no --api-key-env is given: "
                "anyone who can reach it could use it. Give --api-key-env VAR (clients send "
                "'Authorization: Bearer <key>'), or --allow-unauthenticated if that is meant"
            )
        print(
            f"loadlab-server: warning: serving {args.host} without an API key "
            "(--allow-unauthenticated): anyone who can reach it may use it",
            file=sys.stderr,
        )
    return ServerConfig(**vars(args))


def _loopback(host: str) -> bool:
    """``127.0.0.1``, ``::1``, any 127.x address or ``localhost``: reachable from this machine
    only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def _runner(config: ServerConfig) -> Any:
    if config.preset == "fake":
        from reference_server.fake_runner import FakeModelRunner

        return FakeModelRunner(
            config.num_kv_blocks or 4096, config.block_size, sleep_s_per_step=0.002
        )
    from reference_server.model_runner import ModelRunner  # torch is imported only here

    kv_bytes = int(config.kv_cache_mb * 2**20) if config.kv_cache_mb else None
    return ModelRunner(config.preset, num_kv_blocks=config.num_kv_blocks, kv_cache_bytes=kv_bytes,
                       block_size=config.block_size, seed=config.seed, threads=config.threads)  # fmt: skip


def build_app(config: ServerConfig) -> tuple[Any, EngineLike, dict[str, Any]]:
    """Runner, block manager, scheduler, engine and ASGI app from a config."""
    if config.mode == "disaggregated":  # worker processes behind the same engine interface
        from reference_server.disagg.router import build_app as build_disaggregated

        return build_disaggregated(config)
    runner = _runner(config)
    info = dict(runner.info())
    capacity = runner.num_kv_blocks * runner.block_size
    # One request must always fit the cache alone, or admission could wait forever.
    max_model_len = min(
        int(info.get("max_model_len") or info.get("max_seq_len") or capacity), capacity
    )
    if config.max_model_len:
        max_model_len = min(max_model_len, config.max_model_len)
    caching = config.prefix_caching == "on"
    bm = BlockManager(runner.num_kv_blocks, runner.block_size, prefix_caching=caching)
    batched = config.max_batched_tokens or (512 if config.mode == "chunked" else None)
    scheduler = make_scheduler(config.mode, bm, max_num_seqs=config.max_num_seqs,
                               max_model_len=max_model_len, max_num_batched_tokens=batched,
                               chunk_size=config.chunk_size, finished_slots=config.static_finished,
                               eos_id=int(info.get("eos_id", 256)))  # fmt: skip
    engine = Engine(runner, scheduler)
    info.update(mode=config.mode, max_num_seqs=config.max_num_seqs, max_model_len=max_model_len,
                block_size=runner.block_size, num_kv_blocks=runner.num_kv_blocks,
                max_num_batched_tokens=scheduler.max_num_batched_tokens,
                prefix_caching=caching)  # fmt: skip
    if config.mode == "chunked":
        info["chunk_size"] = config.chunk_size
    if config.mode == "static":
        info["static_finished"] = config.static_finished
    settings = ServerSettings(model_name=config.model_name, max_model_len=max_model_len,
                              max_queue=config.max_queue, info=info,
                              api_key=config.api_key(), **config.answer_settings())  # fmt: skip
    return create_app(engine, settings), engine, info


class _Server(uvicorn.Server):
    ready_line = ""

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started:
            print(self.ready_line, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        app, _engine, info = build_app(config)
    except (ValueError, RuntimeError) as exc:
        print(f"loadlab-server: {exc}", file=sys.stderr)
        return 2
    # Hand the GIL over every 0.5 ms instead of 5 ms: the engine thread releases it inside
    # each torch op and must not wait a whole interval for the HTTP thread to give it back.
    sys.setswitchinterval(0.0005)
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                               timeout_graceful_shutdown=3, access_log=False,
                               http=with_request_deadline(config.request_read_timeout))  # fmt: skip
    server = _Server(uv_config)
    server.ready_line = (
        f"loadlab-server ready: http://{config.host}:{config.port} mode={config.mode} "
        f"preset={config.preset} device={info.get('device')} kv_blocks={info['num_kv_blocks']} "
        f"max_num_seqs={config.max_num_seqs} max_model_len={info['max_model_len']} "
        f"prefix_caching={'on' if info.get('prefix_caching') else 'off'}"
    )
    # uvicorn shuts down gracefully on SIGTERM or SIGINT, then raises the signal again with
    # the handler it found: with the default one the process dies there, before atexit, and
    # the disaggregated workers' queues leak their semaphores. Ours exits instead (128 +
    # the signal, the code the signal would give), so atexit stops the workers and frees them.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_on)
    server.run()
    return 0


def _exit_on(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
