"""GPU telemetry and energy per token on one GPU: the reference server's ``1b`` preset on CUDA.

    python3 benchmarks/gpu_telemetry.py                 # about 3 minutes on an H200
    python3 benchmarks/gpu_telemetry.py --quick         # fewer requests per batch

What it does, in one prepared run (exits 2 with a clear message where there is no GPU):

1. starts the reference server (``1b`` preset: Llama-3.2-1B shapes, bf16 on CUDA, random
   weights, prefix caching off so every decode step is a real one);
2. runs ``loadlab`` against it at batch 1 and at batch 64 (closed loop, 64-token prompts,
   exactly ``--max-tokens`` output tokens), each run sampling the GPU through NVML
   (``--gpu-metrics nvml``) with an idle baseline of ``--baseline`` seconds before its first
   request;
3. prints, per batch: decode tokens/s (the window's output tokens/s, and per stream from the
   median TPOT), the HBM bandwidth a decode step needs at that rate against ``--peak-tbps``
   (H200: 4.8 TB/s), the GPU's idle and mean power, utilisation, SM clock, and joules per
   output token, total and above idle.

Bandwidth accounting (``reference_server.bench``, as gpt-fast prints it): a decode step reads
every non-embedding weight once plus the K/V of every attended token; steps/s = 1000 /
median TPOT. Results files go to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout


def no_gpu(why: str) -> int:
    print(f"benchmarks/gpu_telemetry.py: no GPU here ({why}); run it on a machine with an "
          "NVIDIA GPU, its driver, torch with CUDA and nvidia-ml-py (pip install -e '.[server,gpu]')",
          file=sys.stderr)  # fmt: skip
    return 2


def check_gpu() -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    from loadlab._runner.telemetry import open_nvml
    from loadlab.errors import ConfigError

    try:
        open_nvml().nvmlShutdown()
    except ConfigError as exc:
        return str(exc)
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batches", default="1,64", help="closed-loop concurrencies (default 1,64)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="requests per stream (default 3)")
    p.add_argument("--baseline", type=float, default=5.0, help="idle seconds before each run")
    p.add_argument("--peak-tbps", type=float, default=4.8, help="HBM peak, TB/s (H200: 4.8)")
    p.add_argument("--out-dir", default="reports/gpu-telemetry")
    p.add_argument("--quick", action="store_true", help="one request per stream, 128 tokens")
    a = p.parse_args()
    if a.quick:
        a.rounds, a.max_tokens = 1, 128
    why = check_gpu()
    if why is not None:
        return no_gpu(why)

    from loadlab._analysis import metrics
    from loadlab._analysis.telemetry import energy_of, telemetry_of
    from loadlab._runner.run import run
    from loadlab.config import EndpointConfig, RunConfig
    from loadlab.results import write_results
    from reference_server.bench import weight_bytes
    from reference_server.config import ServerConfig
    from reference_server.launch import start_server
    from reference_server.model import PRESETS

    args = PRESETS["1b"]
    dtype_bytes = 2  # bf16 on CUDA
    kv_per_token = 2 * args.n_layers * args.n_kv_heads * args.head_dim * dtype_bytes
    batches = [int(x) for x in a.batches.split(",")]
    server_cfg = ServerConfig(preset="1b", max_num_seqs=max(batches), prefix_caching="off",
                              kv_cache_mb=8192)  # fmt: skip
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    print("starting the reference server (1b preset on CUDA) ...", file=sys.stderr)
    with start_server(config=server_cfg, timeout_s=600) as server:
        ep = EndpointConfig(url=server.url, name="reference-1b")
        for batch in batches:
            cfg = RunConfig(
                endpoints=(ep,), concurrency=batch, requests=batch * a.rounds,
                prompt_tokens=a.prompt_tokens, max_tokens=a.max_tokens, progress=False,
                workload={"kind": "synthetic", "exact_output": True}, tokenizer="byte",
                gpu_metrics={"*": "nvml"}, gpu_interval_s=0.2, gpu_baseline_s=a.baseline,
                saturation_lag_ms=1000.0,
            )  # fmt: skip
            print(f"batch {batch}: {batch * a.rounds} requests ...", file=sys.stderr)
            res = run(cfg, write=False).runs[0].results
            write_results(res, out_dir / f"batch-{batch}.json")
            window = res.measurement_window_ns()
            lat = metrics.latency_records(res.records, window)
            tpot = statistics.median(t for r in lat if (t := metrics.tpot_ms(r)) is not None)
            tp = metrics.throughput(res.records, window)
            steps_per_s = 1000 / tpot
            context = a.prompt_tokens + a.max_tokens / 2
            step_bytes = weight_bytes(args, dtype_bytes) + batch * context * kv_per_token
            e = energy_of(res)
            tel = telemetry_of(res) or {}
            g = (tel.get("gpus") or [{}])[0]
            lo, hi = window
            inside = [i for i, t in enumerate(g.get("t_ns", [])) if lo <= t <= hi]

            def mean(field: str, g: dict = g, inside: list[int] = inside) -> float | None:
                vals = [g[field][i] for i in inside if g.get(field) and g[field][i] is not None]
                return sum(vals) / len(vals) if vals else None

            ge = e.gpus[0] if e is not None and e.gpus else None
            rows.append({
                "batch": batch, "ok": sum(r.ok for r in res.records),
                "out_tok_s": tp.output_tokens_per_s, "stream_tok_s": 1000 / tpot,
                "tbps": step_bytes * steps_per_s / 1e12,
                "idle_w": ge.idle_w if ge else None, "mean_w": ge.mean_w if ge else None,
                "util": mean("gpu_util_pct"), "sm_mhz": mean("sm_clock_mhz"),
                "j_tok": e.joules_per_output_token if e else None,
                "j_tok_above": e.joules_per_output_token_above_idle if e else None,
                "missing": e.missing if e else "no telemetry",
                "model": g.get("model", "?"),
            })  # fmt: skip
    print(table(rows, a.peak_tbps))
    print(f"results files: {out_dir}/batch-*.json")
    return 0 if all(r["ok"] for r in rows) else 1


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table(rows: list[dict], peak_tbps: float) -> str:
    head = (f"{'batch':>5} {'ok':>4} {'out tok/s':>10} {'tok/s/stream':>12} {'HBM TB/s':>9} "
            f"{'of peak':>8} {'idle W':>7} {'mean W':>7} {'util %':>7} {'SM MHz':>7} "
            f"{'J/token':>8} {'J/tok>idle':>10}")  # fmt: skip
    lines = [f"GPU: {rows[0]['model'] if rows else '?'}; HBM peak {peak_tbps:g} TB/s", head,
             "-" * len(head)]  # fmt: skip
    for r in rows:
        lines.append(
            f"{r['batch']:>5} {r['ok']:>4} {r['out_tok_s']:>10.1f} {r['stream_tok_s']:>12.1f} "
            f"{r['tbps']:>9.3f} {r['tbps'] / peak_tbps:>8.1%} {_f(r['idle_w'], '.1f'):>7} "
            f"{_f(r['mean_w'], '.1f'):>7} {_f(r['util'], '.0f'):>7} {_f(r['sm_mhz'], '.0f'):>7} "
            f"{_f(r['j_tok'], '.4f'):>8} {_f(r['j_tok_above'], '.4f'):>10}"
        )
        if r["missing"]:
            lines.append(f"      energy: {r['missing']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
