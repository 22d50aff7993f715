"""Capacity: estimate GPUs needed, and hold the estimate against measurements.

Modules, pure ones first (no torch)::

    models.py     ModelSpec and presets (Llama 3 shapes; the reference server's, lazily)
    hardware.py   Hardware presets (H100, H200, A100, L4) with achievable fractions
    roofline.py   prefill / decode-step time, KV bytes, max concurrency, Little's law
    sizing.py     the sizing sequence: throughput bound, memory cross-check, the larger
    calibrate.py  "this-machine": square matmul and copy, cached per host
    kernels.py    kernels shaped like one model's (torch): matmuls, attention
    measured.py   the reference model's step times against the estimates
    vs_run.py     a results file's TTFT and TPOT against the roofline

Example::

    from loadlab._capacity.sizing import size_from_figures
    print(size_from_figures(2000, 250, 400, headroom=0.3).to_text())   # ... => 65 GPUs
"""

from __future__ import annotations

__all__: list[str] = []
