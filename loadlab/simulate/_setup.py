"""The simulated server and its step-time model from command-line flags (shared by
``loadlab simulate`` and the commands that predict: ``capacity --simulate``,
``sweep --predict``).

Server flags carry ``loadlab-server``'s names and defaults, so a simulated server is set up
exactly like the real one. The step time comes from, in this order: ``--step-model FILE`` (a
fitted model, ``loadlab.simulate._fit``), else the roofline of ``--sim-model`` on
``--hardware`` (a GPU preset, or ``this-machine``: its cached calibration). A model fitted to a
server's step log carries the spread of its steps; ``--step-jitter off`` prices every step at
its median instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from loadlab._capacity.hardware import (
    DEFAULT_MEMORY_RESERVE_FRACTION,
    HARDWARE,
    THIS_MACHINE,
    Hardware,
    get_hardware,
)
from loadlab._capacity.models import MODELS, REFERENCE_PREFIX, ModelSpec, get_model
from loadlab.errors import TOO_DEEP, ConfigError
from loadlab.records import pick
from loadlab.simulate._server import FINISHED_SLOTS, MODES, ServerConfig
from loadlab.simulate._steptime import (
    RooflineStepTime,
    StepTimeModel,
    model_from_dict,
    without_jitter,
)

__all__ = [
    "add_jitter_argument",
    "add_server_arguments",
    "add_step_arguments",
    "default_kv_blocks",
    "jitter_as_asked",
    "load_step_model",
    "server_from_args",
    "step_model_from_args",
]

CPU_KV_BYTES = 1 << 30  # the reference server's CPU default cap (model_runner._default_kv_bytes)


def add_server_arguments(p: argparse.ArgumentParser, mode: bool = True) -> None:
    """The simulated server's flags; ``mode=False`` where the command has its own ``--mode``."""
    g = p.add_argument_group("simulated server (loadlab-server's flags and defaults)")
    if mode:
        g.add_argument("--mode", choices=MODES, default="continuous", help="scheduling policy")
    g.add_argument("--max-num-seqs", type=int, default=32, help="largest running batch")
    g.add_argument("--num-kv-blocks", type=int, help="KV cache blocks (default: from the model)")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--max-model-len", type=int, default=4096, help="context cap")
    g.add_argument("--max-batched-tokens", type=int, help="tokens per step (chunked: 512)")
    g.add_argument("--chunk-size", type=int, default=256, help="longest prompt slice (chunked)")
    g.add_argument("--static-finished", choices=FINISHED_SLOTS, default="pad",
                   help="static: finished rows run as padding (pad) or leave (idle)")  # fmt: skip
    g.add_argument("--max-queue", type=int, default=1024, help="waiting requests before 429")
    g.add_argument("--prefix-caching", choices=("on", "off"), default="on",
                   help="reuse cached KV blocks of prompt prefixes (disaggregated: prefill side)")  # fmt: skip
    d = p.add_argument_group("simulated disaggregated mode")
    d.add_argument("--prefill-workers", type=int, default=1, help="prefill engine loops")
    d.add_argument("--decode-workers", type=int, default=1, help="decode engine loops")
    d.add_argument("--max-held", type=int, help="prefilled requests a worker holds (max-num-seqs)")
    d.add_argument("--kv-transfer-gbps", type=float, default=1.0,
                   help="KV transfer bandwidth, GB/s (default 1: gloo over loopback)")  # fmt: skip
    d.add_argument("--kv-transfer-latency-ms", type=float, default=1.0,
                   help="fixed cost of one KV transfer (ms)")  # fmt: skip


def add_step_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("step-time model")
    g.add_argument("--step-model", metavar="FILE", help="a fitted step-time model (JSON)")
    g.add_argument("--sim-model", default="ref-cpu",
                   help=f"model shapes for the roofline: {', '.join(MODELS)}, ref-<preset>")  # fmt: skip
    g.add_argument("--hardware", default=THIS_MACHINE,
                   help=f"{', '.join(HARDWARE)}, or {THIS_MACHINE} (its calibration)")  # fmt: skip
    g.add_argument("--compute-efficiency", type=float, help="achieved / peak FLOP/s")
    g.add_argument("--bandwidth-efficiency", type=float, help="achieved / peak bytes/s")
    g.add_argument("--step-overhead-ms", type=float, help="fixed cost of every step (ms)")
    add_jitter_argument(g)


def add_jitter_argument(g: Any) -> None:
    """``--step-jitter``: whether a fitted model's measured step spread is used."""
    g.add_argument("--step-jitter", choices=("on", "off"), default="on",
                   help="draw each step's time from the spread a fitted model measured (on), "
                        "or price every step at its shape's median (off)")  # fmt: skip


def jitter_as_asked(args: argparse.Namespace, model: StepTimeModel) -> StepTimeModel:
    """``model``, without its step spread where ``--step-jitter off`` says so."""
    return without_jitter(model) if getattr(args, "step_jitter", "on") == "off" else model


def _hardware(args: argparse.Namespace) -> Hardware:
    if args.hardware.lower() == THIS_MACHINE:
        from loadlab._capacity.calibrate import load_or_calibrate

        hw = load_or_calibrate(log=sys.stderr)
    else:
        hw = get_hardware(args.hardware)
    hw = hw.derated(args.compute_efficiency, args.bandwidth_efficiency)
    if args.step_overhead_ms is not None:
        import dataclasses

        hw = dataclasses.replace(hw, step_overhead_s=args.step_overhead_ms / 1e3)
    return hw


def _model_spec(args: argparse.Namespace, hw: Hardware | None) -> ModelSpec:
    name = str(args.sim_model)
    ref = name.lower().startswith(REFERENCE_PREFIX)
    dtype = 2 if ref and hw is not None and hw.kind == "gpu" else None  # bf16 on CUDA
    return get_model(name, dtype)


def load_step_model(args: argparse.Namespace) -> StepTimeModel:
    """``--step-model FILE`` as ``--step-jitter`` asks; a file that cannot be read or is not a
    step-time model is a ``ConfigError`` naming it (``simulate``, ``sweep --predict`` and
    ``capacity --simulate`` alike)."""
    path = args.step_model
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--step-model {path}: cannot read it ({exc})") from exc
    except RecursionError:
        raise ConfigError(f"--step-model {path}: {TOO_DEEP}") from None
    try:
        model = model_from_dict(data)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(f"--step-model {path}: not a step-time model ({exc!r})") from exc
    return jitter_as_asked(args, model)


def step_model_from_args(args: argparse.Namespace) -> StepTimeModel:
    if args.step_model:
        return load_step_model(args)
    hw = _hardware(args)
    return RooflineStepTime(_model_spec(args, hw), hw)


def default_kv_blocks(
    model: ModelSpec, block_size: int, max_model_len: int, gpu: Hardware | None = None
) -> int:
    """What the server would allocate: on a GPU the memory left after the weights (less the
    usual 10 % reserve); on a CPU the reference server's cap (64 full contexts, at most 1 GiB)."""
    per_block = model.kv_bytes_per_token * block_size
    if gpu is not None:
        budget = gpu.memory_bytes * (1 - DEFAULT_MEMORY_RESERVE_FRACTION) - model.weight_bytes
    else:
        budget = min(64 * max_model_len * model.kv_bytes_per_token, CPU_KV_BYTES)
    blocks = int(budget // per_block)
    if blocks < 1:
        raise ConfigError(f"{model.name} leaves no KV cache on this device; give --num-kv-blocks")
    return blocks


def server_from_args(args: argparse.Namespace, step_model: StepTimeModel) -> ServerConfig:
    if isinstance(step_model, RooflineStepTime):
        hw = step_model.hardware
        m, gpu = step_model.model, hw if hw.kind == "gpu" else None
    else:  # a fitted model knows no memory: the reference server's CPU rule for --sim-model
        m, gpu = _model_spec(args, None), None
    blocks = args.num_kv_blocks
    if blocks is None:
        blocks = default_kv_blocks(m, args.block_size, args.max_model_len, gpu)
    return ServerConfig(
        **pick(
            args,
            "mode block_size max_num_seqs max_model_len chunk_size static_finished "
            "max_queue prefill_workers decode_workers max_held",
        ),
        num_kv_blocks=blocks,
        max_num_batched_tokens=args.max_batched_tokens,
        prefix_caching=args.prefix_caching == "on",
        kv_bytes_per_token=m.kv_bytes_per_token,
        kv_transfer_bytes_per_s=args.kv_transfer_gbps * 1e9,
        kv_transfer_latency_s=args.kv_transfer_latency_ms / 1e3,
    )
