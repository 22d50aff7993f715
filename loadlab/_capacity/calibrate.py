""" "this-machine": a hardware preset measured here, in a few seconds, and cached per host.

Two microbenchmarks give the two roofs:

- achieved FLOP/s: a square matmul (torch when installed, else numpy; fp32 on CPU, bf16 on
  CUDA), 2 * n^3 FLOPs per product;
- achieved bandwidth: a copy of an array several times larger than the last-level cache,
  2 * size bytes moved (read + write), the STREAM "copy" kernel (McCalpin 1995).

Timings are the fastest of several repeats: on a shared machine interference only ever adds
time, and the reference server's bench (``reference_server.bench``) reports its step times
the same way, so estimate and measurement use one statistic. The result is cached
in ``~/.cache/loadlab/this-machine-<host>-<threads>t.json`` (``LOADLAB_CACHE_DIR`` overrides the folder);
``--calibrate`` measures again.

Example::

    hw = load_or_calibrate()          # cached after the first call
    print(hw.achieved_flops_per_s / 1e9, "GFLOP/s")
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from loadlab._capacity.hardware import THIS_MACHINE, Hardware

__all__ = [
    "best_time_s",
    "cache_path",
    "calibrate",
    "load_or_calibrate",
    "measure_copy_bytes_per_s",
    "measure_matmul_flops_per_s",
]

CACHE_VERSION = 1


def best_time_s(
    fn: Callable[[], object],
    repeats: int,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Fastest time of ``fn()`` over ``repeats`` calls after ``warmup`` untimed ones.

    ``clock`` is wall time by default; ``time.thread_time`` counts only the CPU time of this
    thread (single-threaded work on a shared machine: time spent descheduled is not counted).
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)


def _torch() -> Any | None:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _sync(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure_matmul_flops_per_s(
    n: int = 1024, repeats: int = 7, clock: Callable[[], float] = time.perf_counter
) -> tuple[float, str]:
    """Achieved FLOP/s of an n x n by n x n matmul, and which backend measured it."""
    torch = _torch()
    if torch is None:
        import numpy as np

        a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
        b = a.T.copy()
        t = best_time_s(lambda: a @ b, repeats, clock=clock)
        return 2.0 * n**3 / t, "numpy-fp32"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    n = 8192 if device == "cuda" else n
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device, dtype)
    b = torch.randn(n, n, generator=gen).to(device, dtype)

    def run() -> None:
        with torch.no_grad():
            torch.mm(a, b)
        _sync(torch, device)

    t = best_time_s(run, repeats, clock=clock)
    return 2.0 * n**3 / t, f"torch-{device}-{str(dtype).removeprefix('torch.')}"


def measure_copy_bytes_per_s(
    megabytes: int = 256, repeats: int = 7, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Achieved memory bandwidth of copying ``megabytes`` (bytes read + bytes written per s)."""
    torch = _torch()
    n = megabytes * 1_000_000 // 4
    if torch is None:
        import numpy as np

        src = np.ones(n, dtype=np.float32)
        dst = np.empty_like(src)
        t = best_time_s(lambda: np.copyto(dst, src), repeats, clock=clock)
        return 2.0 * src.nbytes / t
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        n *= 16  # 4 GB: well past the 50 MB L2
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)

    def run() -> None:
        dst.copy_(src)
        _sync(torch, device)

    t = best_time_s(run, repeats, clock=clock)
    return 2.0 * src.numel() * 4 / t


def _memory_bytes() -> tuple[float, str]:
    torch = _torch()
    if torch is not None and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return float(props.total_memory), "gpu"
    import psutil

    return float(psutil.virtual_memory().total), "cpu"


def _threads() -> int:
    torch = _torch()
    return int(torch.get_num_threads()) if torch is not None else (os.cpu_count() or 1)


def cache_path(host: str | None = None, threads: int | None = None) -> Path:
    """Where this host's calibration is cached (one file per host and thread count)."""
    folder = Path(os.environ.get("LOADLAB_CACHE_DIR") or Path.home() / ".cache" / "loadlab")
    threads = threads or _threads()
    return folder / f"{THIS_MACHINE}-{host or socket.gethostname()}-{threads}t.json"


def calibrate(
    matmul_n: int = 1024,
    copy_mb: int = 256,
    repeats: int = 7,
    clock: Callable[[], float] = time.perf_counter,
) -> Hardware:
    """Measure this machine now (a few seconds) and return it as a ``Hardware``."""
    t0 = time.perf_counter()
    flops, backend = measure_matmul_flops_per_s(matmul_n, repeats, clock)
    bandwidth = measure_copy_bytes_per_s(copy_mb, repeats, clock)
    memory, kind = _memory_bytes()
    return Hardware(
        name=THIS_MACHINE,
        peak_flops_per_s=flops,
        peak_bytes_per_s=bandwidth,
        memory_bytes=memory,
        compute_efficiency=1.0,  # measured, so already what is achieved
        bandwidth_efficiency=1.0,
        kind=kind,
        source=f"calibrated on {socket.gethostname()}: {matmul_n}^3 matmul ({backend}), "
        f"{copy_mb} MB copy",
        extra={
            "host": socket.gethostname(),
            "backend": backend,
            "threads": _threads(),
            "calibrated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "calibration_s": round(time.perf_counter() - t0, 2),
            "cache_version": CACHE_VERSION,
        },
    )


def load_or_calibrate(
    force: bool = False, path: Path | None = None, log: IO[str] | None = None
) -> Hardware:
    """The cached calibration for this host, measuring (and caching) it when missing/forced."""
    path = path or cache_path()
    if not force and path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("extra", {}).get("cache_version") == CACHE_VERSION:
                return Hardware.from_dict(data)
        except (OSError, ValueError, TypeError):
            pass  # unreadable cache: measure again
    if log is not None:
        print("calibrating this machine (matmul and memory copy, a few seconds)...", file=log)
    hw = calibrate()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(hw.to_dict(), indent=2), encoding="utf-8")
    if log is not None:
        print(
            f"this machine: {hw.peak_flops_per_s / 1e9:.1f} GFLOP/s, "
            f"{hw.peak_bytes_per_s / 1e9:.2f} GB/s; cached in {path}",
            file=log,
        )
    return hw


if __name__ == "__main__":  # python -m loadlab._capacity.calibrate
    print(json.dumps(load_or_calibrate(force=True, log=sys.stderr).to_dict(), indent=2))
