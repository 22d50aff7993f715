"""``loadlab capacity``: GPUs needed, roofline tables, calibration, estimate vs measurement.

Examples::

    loadlab capacity --decode-tokens-per-s 2000 --completion-tokens 250 --peak-rps 400 --headroom 0.3
    loadlab capacity --model llama-3-8b --hardware h100 --prompt-tokens 1000 \\
        --completion-tokens 250 --peak-rps 400
    loadlab capacity --model llama-3-8b --hardware h200          # roofline table only
    loadlab capacity --hardware this-machine --calibrate
    loadlab capacity --vs-measured --preset cpu
    loadlab capacity --results reports/run.json --url http://127.0.0.1:8000
    loadlab capacity --results reports/vendor.json --model llama-3-8b --hardware h100
    loadlab capacity --simulate --slo examples/slo.toml --model llama-3-8b --hardware h100 \
        --prompt-tokens 1000 --completion-tokens 250 --peak-rps 400 --gpu-hour-price 2.5 \
        --max-num-seqs 256 --max-model-len 8192     # the SLO bound, by simulation
"""

from __future__ import annotations

import argparse
import json
import sys

from loadlab._capacity import roofline
from loadlab._capacity.hardware import (
    DEFAULT_MEMORY_RESERVE_FRACTION,
    HARDWARE,
    THIS_MACHINE,
    Hardware,
    get_hardware,
)
from loadlab._capacity.models import DTYPE_BYTES, MODELS, ModelSpec, get_model
from loadlab._capacity.sizing import (
    DEFAULT_BATCH,
    MemoryCheck,
    size_first_principles,
    size_from_figures,
)
from loadlab.errors import ConfigError, require

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the sizing sequence from given figures")
    g.add_argument("--decode-tokens-per-s", type=float, help="batched decode tokens/s per GPU")
    g.add_argument("--completion-tokens", type=float, help="average completion length (tokens)")
    g.add_argument("--peak-rps", type=float, help="peak completions (requests) per second")
    g.add_argument("--headroom", type=float, default=0.3, help="prefill + spare (0.3 = +30%%)")
    f = p.add_argument_group("first principles (model x hardware)")
    f.add_argument("--model", help=f"{', '.join(MODELS)}, or ref-<preset> (ref-cpu, ref-1b)")
    f.add_argument("--hardware", help=f"{', '.join(HARDWARE)}, {THIS_MACHINE}")
    f.add_argument("--prompt-tokens", type=int, help="average prompt length (tokens)")
    f.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="decode batch per GPU")
    f.add_argument("--dtype", choices=sorted(DTYPE_BYTES), help="weights and KV cache dtype")
    f.add_argument("--compute-efficiency", type=float, help="achieved / peak FLOP/s (0.6)")
    f.add_argument("--bandwidth-efficiency", type=float, help="achieved / peak bytes/s (0.8)")
    f.add_argument("--prefix-hit-rate", type=float, metavar="H",
                   help="fraction of prompt tokens served from a prefix cache, e.g. 0.5 "
                   "(default: none); prices only the uncached prefill and counts shared "
                   "prefix blocks once, so it needs --model, --hardware and --prompt-tokens")  # fmt: skip
    f.add_argument("--shared-prefixes", type=int, default=1, metavar="P",
                   help="distinct cached prefixes per GPU, counted once each (default 1)")  # fmt: skip
    f.add_argument("--reserve", type=float, default=DEFAULT_MEMORY_RESERVE_FRACTION,
                   help="memory fraction kept from the KV cache (0.1)")  # fmt: skip
    c = p.add_argument_group("this machine and measurements")
    c.add_argument("--calibrate", action="store_true", help="(re)measure this machine now")
    c.add_argument("--vs-measured", action="store_true", help="estimate vs measurement table")
    c.add_argument("--preset", default="cpu", help="reference preset measured (--vs-measured)")
    c.add_argument("--results", help="results file: its TTFT/TPOT against the roofline")
    c.add_argument("--url", help="reference server base URL (reads /v1/server_info)")
    c.add_argument("--batches", default="1,2,4,8,16,32", help="batch sizes measured")
    c.add_argument("--prompts", default="128,256,512,1024,2048", help="prompt lengths measured")
    c.add_argument("--context-tokens", type=int, default=256, help="context of decode steps")
    c.add_argument("--repeats", type=int, default=3, help="repeats per measurement")
    c.add_argument("--rounds", type=int, default=2, help="interleaved rounds per point")
    c.add_argument("--threads", type=int, help="torch threads for --vs-measured")
    c.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: this thread's CPU time (with --threads 1, on a busy machine)")  # fmt: skip
    from loadlab.simulate._capacity import add_capacity_arguments

    add_capacity_arguments(p)
    p.add_argument("--list", action="store_true", help="list model and hardware presets")
    p.add_argument("--json", dest="json_out", help="also write the result as JSON here")


def _hardware(args: argparse.Namespace) -> Hardware:
    if args.hardware is None:
        raise ConfigError("--hardware is needed with --model (e.g. --hardware h100)")
    if args.hardware.lower() == THIS_MACHINE:
        from loadlab._capacity.calibrate import load_or_calibrate

        hw = load_or_calibrate(force=args.calibrate, log=sys.stderr)
    else:
        hw = get_hardware(args.hardware)
    return hw.derated(args.compute_efficiency, args.bandwidth_efficiency)


def _model(args: argparse.Namespace, hw: Hardware | None = None) -> ModelSpec:
    dtype = DTYPE_BYTES[args.dtype] if args.dtype else None
    if (
        dtype is None
        and hw is not None
        and hw.kind == "gpu"
        and args.model.lower().startswith("ref-")
    ):
        dtype = 2  # the reference server runs bf16 on CUDA
    return get_model(args.model, dtype)


def _print_list() -> None:
    print("models:")
    for m in MODELS.values():
        print(f"  {m.name:<14} {m.num_params / 1e9:6.2f} B params, {m.n_layers} layers, "
              f"{m.n_heads}/{m.n_kv_heads} heads x {m.head_dim}, KV {m.kv_bytes_per_token:,} B/token")  # fmt: skip
    print("  ref-tiny, ref-cpu, ref-1b  (the reference server's presets; need torch)")
    print("hardware:")
    for h in HARDWARE.values():
        print(f"  {h.name:<6} {h.peak_flops_per_s / 1e12:7.1f} TFLOP/s  "
              f"{h.peak_bytes_per_s / 1e12:5.2f} TB/s  {h.memory_bytes / 1e9:5.0f} GB  ({h.source})")  # fmt: skip
    print(f"  {THIS_MACHINE}  measured by --calibrate (cached per host)")


def roofline_table(m: ModelSpec, hw: Hardware, context_tokens: int = 1024) -> str:
    """Decode step time by batch and prefill time by prompt length, as text."""
    lines = [
        f"{m.name} on {hw.name}: {m.num_params / 1e9:.3g} B params, weights "
        f"{m.weight_bytes / 1e9:.3g} GB, KV cache {m.kv_bytes_per_token:,} bytes/token",
        f"achieved {hw.achieved_flops_per_s / 1e12:.4g} TFLOP/s ({hw.compute_efficiency:.0%} of "
        f"peak), {hw.achieved_bytes_per_s / 1e9:.4g} GB/s ({hw.bandwidth_efficiency:.0%} of peak)",
        f"decode step, context {context_tokens:,} tokens per sequence:",
        "  batch   step ms   tokens/s   bound",
    ]
    for b in (1, 8, 16, 32, 64, 128, 256):
        e = roofline.decode_step(m, hw, b, context_tokens)
        lines.append(f"  {b:>5} {e.time_s * 1e3:>9.3f} {b / e.time_s:>10,.0f}   {e.bound}")
    lines += ["prefill of one prompt:", "  tokens   prefill ms   bound"]
    for p in (128, 512, 2048, 8192):
        e = roofline.prefill(m, hw, p)
        lines.append(f"  {p:>6} {e.time_s * 1e3:>12.3f}   {e.bound}")
    conc = roofline.max_concurrency(m, hw, context_tokens)
    lines.append(f"max sequences of {context_tokens:,} tokens in memory: {conc:,}")
    return "\n".join(lines)


def _vs_run(args: argparse.Namespace) -> int:
    """A results file's TTFT and TPOT against the roofline (model from server_info or --model)."""
    from loadlab._capacity.vs_run import (
        compare_run,
        fetch_server_info,
        format_run_table,
        model_from_info,
    )
    from loadlab.results import read_results

    results = read_results(args.results)
    if args.model:
        hw = _hardware(args)
        m = _model(args, hw)
    else:
        info = results.extra.get("server_info")
        if args.url:
            info = fetch_server_info(args.url)
        if not info:
            raise ConfigError(
                "which model served this run? give --url of the reference server, or "
                "--model and --hardware"
            )
        m = model_from_info(dict(info))
        if args.hardware is None:
            args.hardware = THIS_MACHINE  # the reference server ran here
        hw = _hardware(args)
    print(format_run_table(compare_run(results, m, hw), m, hw))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.list:
        _print_list()
        return 0
    if args.results:
        return _vs_run(args)
    if args.vs_measured:
        require("server", "--vs-measured (it measures the reference model)")
        from loadlab._capacity.measured import run_vs_measured

        return run_vs_measured(args)
    _check_prefix_hit_rate(args)
    out: dict[str, object] = {}
    if args.simulate:
        from loadlab.simulate._capacity import run_capacity

        hw = _hardware(args) if args.model else None
        out = run_capacity(args, _model(args, hw) if args.model else None, hw)
        if args.json_out:
            _write_json(args.json_out, out)
        return 0
    if args.decode_tokens_per_s is not None:
        if args.completion_tokens is None or args.peak_rps is None:
            raise ConfigError("the sequence needs --completion-tokens and --peak-rps too")
        check = None
        if args.model and args.prompt_tokens:
            hw = _hardware(args)
            check = MemoryCheck(_model(args, hw), hw, args.prompt_tokens, args.batch, args.reserve,
                                args.prefix_hit_rate or 0.0, args.shared_prefixes)  # fmt: skip
        elif args.model or args.prompt_tokens:
            print("note: the memory cross-check needs --model, --hardware and --prompt-tokens",
                  file=sys.stderr)  # fmt: skip
        plan = size_from_figures(
            args.decode_tokens_per_s, args.completion_tokens, args.peak_rps, args.headroom, check
        )
        print(plan.to_text())
        out = plan.to_dict()
    elif args.model:
        hw = _hardware(args)
        m = _model(args, hw)
        if args.peak_rps is not None:
            if args.prompt_tokens is None or args.completion_tokens is None:
                raise ConfigError("sizing needs --prompt-tokens and --completion-tokens too")
            check = MemoryCheck(m, hw, args.prompt_tokens, args.batch, args.reserve,
                                args.prefix_hit_rate or 0.0, args.shared_prefixes)  # fmt: skip
            plan = size_first_principles(
                check, int(args.completion_tokens), args.peak_rps, args.headroom
            )
            print(roofline_table(m, hw, args.prompt_tokens), end="\n\n")
            print(plan.to_text())
            out = plan.to_dict()
        else:
            print(roofline_table(m, hw, args.prompt_tokens or 1024))
        out.update(model=m.to_dict(), hardware=hw.to_dict())
    elif args.hardware:
        hw = _hardware(args)
        print(json.dumps(hw.to_dict(), indent=2))
        out = hw.to_dict()
    else:
        raise ConfigError(
            "give --decode-tokens-per-s/--completion-tokens/--peak-rps (the sequence), "
            "--model with --hardware (first principles), --vs-measured, or --list"
        )
    if args.json_out:
        _write_json(args.json_out, out)
    return 0


def _check_prefix_hit_rate(args: argparse.Namespace) -> None:
    """``--prefix-hit-rate`` changes a first-principles estimate (the memory check and the
    prefill price need the model and the prompt); where it could change nothing, say so."""
    if args.prefix_hit_rate is None:
        return
    if args.simulate:
        raise ConfigError(
            "--prefix-hit-rate does not apply to --simulate: the simulated server's prefix "
            "cache serves the workload's own prompts (give a --scenario whose prompts share "
            "prefixes, and --prefix-caching on)"
        )
    if not (args.model and args.prompt_tokens):
        raise ConfigError(
            "--prefix-hit-rate changes the estimate only with --model, --hardware and "
            "--prompt-tokens (it prices the uncached part of each prefill and counts shared "
            "prefix blocks once); from --decode-tokens-per-s alone, prefill is inside "
            "--headroom: lower --headroom instead"
        )


def _write_json(path: str, out: dict[str, object]) -> None:
    """``--json``: an unwritable path is exit 2 naming the flag (``write_output``)."""
    from loadlab._report.output import write_output

    text = json.dumps(out, indent=2, default=str)
    write_output(path, "--json", lambda p: p.write_text(text, encoding="utf-8"))
