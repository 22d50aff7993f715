"""Hardware presets: peak dense bf16 FLOP/s, memory bandwidth, memory, and what is achievable.

A datasheet peak is never reached by real kernels, so every preset carries two achievable
fractions: ``compute_efficiency`` (model FLOP utilisation) and ``bandwidth_efficiency``
(memory bandwidth utilisation). The defaults are the typical figures of tuned serving stacks
(decode kernels reach 60-80 % of HBM peak and large GEMMs 60-70 % of tensor-core peak; see
Databricks, "LLM Inference Performance Engineering: Best Practices", 2023, on MBU/MFU); change
them with ``derated``. A calibrated machine ("this-machine", ``calibrate.py``) stores what it
achieved, so its fractions are 1.0.

Example::

    >>> h = get_hardware("h100").derated(compute=1.0, bandwidth=1.0)
    >>> h.achieved_bytes_per_s
    3350000000000.0
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from loadlab.errors import ConfigError, at_least

__all__ = [
    "DEFAULT_BANDWIDTH_EFFICIENCY",
    "DEFAULT_COMPUTE_EFFICIENCY",
    "DEFAULT_MEMORY_RESERVE_FRACTION",
    "HARDWARE",
    "THIS_MACHINE",
    "Hardware",
    "get_hardware",
]

DEFAULT_COMPUTE_EFFICIENCY = 0.6
DEFAULT_BANDWIDTH_EFFICIENCY = 0.8
# Memory kept back from the KV cache for activations, the CUDA context, allocator
# fragmentation: vLLM's default gpu_memory_utilization is 0.9, i.e. 10 % reserved.
DEFAULT_MEMORY_RESERVE_FRACTION = 0.1
THIS_MACHINE = "this-machine"


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or this machine's CPU), as the roofline sees it."""

    name: str
    peak_flops_per_s: float  # dense bf16 tensor FLOP/s (fp32 matmul FLOP/s for a CPU)
    peak_bytes_per_s: float  # memory bandwidth, bytes/s
    memory_bytes: float  # device memory, bytes (decimal GB as on datasheets)
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
    # Fixed cost of one forward pass that neither FLOPs nor bytes explain (kernel launches,
    # Python dispatch); 0 for the datasheet presets, measured by calibration for this machine.
    step_overhead_s: float = 0.0
    kind: str = "gpu"  # "gpu" | "cpu"
    source: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for f in ("peak_flops_per_s", "peak_bytes_per_s", "memory_bytes"):
            if not getattr(self, f) > 0:
                raise ConfigError(f"Hardware.{f} must be > 0, got {getattr(self, f)}")
        for f in ("compute_efficiency", "bandwidth_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise ConfigError(
                    f"{f} must be in (0, 1] (a fraction of peak), got {getattr(self, f)}"
                )
        at_least("step_overhead_s", self.step_overhead_s, 0, error=ConfigError)

    @property
    def achieved_flops_per_s(self) -> float:
        return self.peak_flops_per_s * self.compute_efficiency

    @property
    def achieved_bytes_per_s(self) -> float:
        return self.peak_bytes_per_s * self.bandwidth_efficiency

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where compute and memory time are equal (Williams et al. 2009)."""
        return self.achieved_flops_per_s / self.achieved_bytes_per_s

    def derated(self, compute: float | None = None, bandwidth: float | None = None) -> Hardware:
        """A copy with other achievable fractions (None keeps the current one)."""
        return dataclasses.replace(
            self,
            compute_efficiency=self.compute_efficiency if compute is None else compute,
            bandwidth_efficiency=self.bandwidth_efficiency if bandwidth is None else bandwidth,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Hardware:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


TB = 1e12
GB = 1e9
HARDWARE: dict[str, Hardware] = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 tensor 1,979 TFLOPS *with sparsity*,
    # so 989.4 dense; HBM3 3.35 TB/s; 80 GB.
    "h100": Hardware("h100", 989.4 * TB, 3.35 * TB, 80 * GB, source="NVIDIA H100 datasheet (SXM)"),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): same Hopper compute (1,979 TFLOPS sparse BF16,
    # 989 dense); HBM3e 4.8 TB/s; 141 GB.
    "h200": Hardware("h200", 989.4 * TB, 4.8 * TB, 141 * GB, source="NVIDIA H200 datasheet (SXM)"),
    # NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM: BF16 tensor 312 TFLOPS dense (624 sparse);
    # HBM2e 2,039 GB/s; 80 GB.
    "a100": Hardware(
        "a100", 312 * TB, 2.039 * TB, 80 * GB, source="NVIDIA A100 datasheet (80GB SXM)"
    ),
    # NVIDIA L4 Tensor Core GPU datasheet: BF16 tensor 242 TFLOPS *with sparsity*, so 121 dense;
    # GDDR6 300 GB/s; 24 GB.
    "l4": Hardware("l4", 121 * TB, 300 * GB, 24 * GB, source="NVIDIA L4 datasheet"),
}
_ALIASES = {"h100-sxm": "h100", "h200-sxm": "h200", "a100-80gb": "a100", "a100-sxm": "a100"}


def get_hardware(name: str) -> Hardware:
    """A datasheet preset by name (``this-machine`` comes from ``calibrate.load_or_calibrate``)."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key in HARDWARE:
        return HARDWARE[key]
    if key == THIS_MACHINE:
        raise ConfigError(
            "this-machine is measured, not a datasheet preset: "
            "use loadlab._capacity.calibrate.load_or_calibrate() (CLI: --hardware this-machine)"
        )
    raise ConfigError(
        f"unknown hardware {name!r}; choose one of {', '.join(HARDWARE)}, {THIS_MACHINE}"
    )
