"""Step-time models: how long one forward pass of a scheduled batch takes.

The simulator never looks inside the model. It describes each step by four numbers (a
``StepShape``) and asks a ``StepTimeModel`` for its duration. The same formulas take floats or
numpy arrays, so a stretch of k decode steps is priced in one call.

Step shape (sums over the batch's items; an item processes tokens
``[start, start + n)`` of one sequence, as in ``reference_server/sequence.py``)::

    prefill_tokens  sum n over prompt slices (n > 1): compute-bound rows
    decode_tokens   items with n = 1 (decodes, padding rows): rows that share one weight read
    attn_pairs      sum start * n + n (n + 1) / 2: causal (query, key) pairs
    kv_read_tokens  sum start: cached tokens whose K/V the step reads

Models:

- ``RooflineStepTime``: ``loadlab._capacity.roofline`` for a whole mixed batch:
  ``max(FLOPs / achieved FLOP/s, bytes / achieved bytes/s) + overhead`` with
  FLOPs = 2 N tokens + 4 L d_attn pairs (Kaplan et al. 2020) and bytes = the weights once
  + K/V read + K/V written; a GPU preset or this machine's calibration.
- ``LinearStepTime``: ``c0 + c_pre prefill + c_dec decode + c_pair pairs + c_kv kv_read``,
  fitted to measured step times (``loadlab.simulate._fit``); it carries the range it was fitted
  on, so a caller can refuse to extrapolate silently, and, fitted to a server's step log, the
  spread of those steps about their shape's median (``jitter``: the simulator draws each
  step's factor from it, so a percentile above the median sees the steps a server takes,
  not only their typical price).
- ``RoleStepTime``: disaggregated mode's two kinds of worker, each its own model (fitted on
  that worker's steps: a prefill worker pinned and niced beside the API process steps at
  another pace than the decode worker); the simulator gives each worker its role's model.

Example::

    >>> m = LinearStepTime(base_s=0.01, per_prefill_token_s=1e-4)
    >>> round(m.step_s(prefill_tokens=100, decode_tokens=0, attn_pairs=5050, kv_read_tokens=0), 6)
    0.02
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from loadlab._capacity.hardware import Hardware
from loadlab._capacity.models import ModelSpec
from loadlab.errors import at_least

__all__ = [
    "FEATURES",
    "LinearStepTime",
    "RoleStepTime",
    "RooflineStepTime",
    "StepTimeModel",
    "model_from_dict",
    "without_jitter",
]

# The StepShape's fields, in the order LinearStepTime's coefficients use them.
FEATURES = ("prefill_tokens", "decode_tokens", "attn_pairs", "kv_read_tokens")

Num = Any  # a float or a numpy array of floats (the formulas broadcast)


class StepTimeModel(Protocol):
    """Seconds of one forward pass; arguments may be floats or equal-length arrays."""

    def step_s(
        self, prefill_tokens: Num, decode_tokens: Num, attn_pairs: Num, kv_read_tokens: Num
    ) -> Num: ...

    def describe(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RooflineStepTime:
    """The roofline of one whole step (mixed prefill and decode) on ``hardware``."""

    model: ModelSpec
    hardware: Hardware

    def step_s(
        self, prefill_tokens: Num, decode_tokens: Num, attn_pairs: Num, kv_read_tokens: Num
    ) -> Num:
        m, hw = self.model, self.hardware
        tokens = prefill_tokens + decode_tokens
        flops = 2.0 * m.matmul_params * tokens + 4.0 * m.n_layers * m.attn_dim * attn_pairs
        nbytes = m.weight_bytes_read_per_step + m.kv_bytes_per_token * (kv_read_tokens + tokens)
        compute = flops / hw.achieved_flops_per_s
        memory = nbytes / hw.achieved_bytes_per_s
        return np.maximum(compute, memory) + hw.step_overhead_s

    def describe(self) -> str:
        return f"roofline {self.model.name} on {self.hardware.name}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "roofline",
            "model": self.model.to_dict(),
            "hardware": self.hardware.to_dict(),
        }


@dataclass(frozen=True)
class LinearStepTime:
    """A step time linear in the step's shape, with the ranges it was fitted on.

    ``fit_range`` maps ``prompt_tokens``, ``decode_batch`` and ``context_tokens`` to the
    ``(low, high)`` it saw; empty when the coefficients were set by hand. ``residuals``
    describes the fit (``loadlab.simulate._fit``). ``jitter``: equally likely factors (each a
    measured step's time over its shape's median, as quantiles) by which the simulator
    multiplies each step's price; empty: every step at its price.
    """

    base_s: float = 0.0
    per_prefill_token_s: float = 0.0
    per_decode_token_s: float = 0.0
    per_pair_s: float = 0.0
    per_kv_token_s: float = 0.0
    source: str = "by hand"
    fit_range: dict[str, tuple[float, float]] = field(default_factory=dict)
    residuals: dict[str, Any] = field(default_factory=dict)
    jitter: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for f in ("base_s", "per_prefill_token_s", "per_decode_token_s", "per_pair_s",
                  "per_kv_token_s"):  # fmt: skip
            at_least(f"LinearStepTime.{f}", getattr(self, f), 0)
        for x in self.jitter:
            if not (math.isfinite(x) and x > 0):
                raise ValueError(f"LinearStepTime.jitter: every factor must be > 0, got {x!r}")

    def step_s(
        self, prefill_tokens: Num, decode_tokens: Num, attn_pairs: Num, kv_read_tokens: Num
    ) -> Num:
        return (
            self.base_s
            + self.per_prefill_token_s * prefill_tokens
            + self.per_decode_token_s * decode_tokens
            + self.per_pair_s * attn_pairs
            + self.per_kv_token_s * kv_read_tokens
        )

    def describe(self) -> str:
        spread = ""
        if self.jitter:
            q = np.quantile(self.jitter, [0.1, 0.9])
            spread = f"; each step x {q[0]:.2f}-{q[1]:.2f} (p10-p90 of the measured spread)"
        return (
            f"linear ({self.source}): {self.base_s * 1e3:.3g} ms + "
            f"{self.per_prefill_token_s * 1e6:.3g} us/prefill token + "
            f"{self.per_decode_token_s * 1e6:.3g} us/decode row + "
            f"{self.per_pair_s * 1e9:.3g} ns/attn pair + {self.per_kv_token_s * 1e9:.3g} ns/KV token"
            + spread
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["kind"] = "linear"
        d["fit_range"] = {k: list(v) for k, v in self.fit_range.items()}
        d["jitter"] = [round(x, 4) for x in self.jitter]
        return d


@dataclass(frozen=True)
class RoleStepTime:
    """A prefill worker's model and a decode worker's (disaggregated mode). Asked directly,
    as a single engine's model, a step with prompt tokens is priced by ``prefill``, any
    other by ``decode``."""

    prefill: StepTimeModel
    decode: StepTimeModel

    def step_s(
        self, prefill_tokens: Num, decode_tokens: Num, attn_pairs: Num, kv_read_tokens: Num
    ) -> Num:
        args = (prefill_tokens, decode_tokens, attn_pairs, kv_read_tokens)
        return np.where(np.asarray(prefill_tokens) > 0, self.prefill.step_s(*args),
                        self.decode.step_s(*args))  # fmt: skip

    @property
    def fit_range(self) -> dict[str, tuple[float, float]]:
        """Each key's range from the worker that meets it (prompts: prefill; batch: decode)."""
        pre = getattr(self.prefill, "fit_range", None) or {}
        dec = getattr(self.decode, "fit_range", None) or {}
        out = {k: v for k, v in dec.items() if k != "prompt_tokens"}
        if "prompt_tokens" in pre:
            out["prompt_tokens"] = pre["prompt_tokens"]
        return out

    def describe(self) -> str:
        return (
            f"prefill workers: {self.prefill.describe()}; decode workers: {self.decode.describe()}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "role", "prefill": self.prefill.to_dict(), "decode": self.decode.to_dict()}


def model_from_dict(data: dict[str, Any]) -> StepTimeModel:
    """The inverse of ``to_dict`` (a step-time file written by ``loadlab simulate --fit``)."""
    kind = data.get("kind")
    if kind == "linear":
        names = {f.name for f in dataclasses.fields(LinearStepTime)}
        values = {k: v for k, v in data.items() if k in names}
        values["fit_range"] = {k: (float(v[0]), float(v[1])) for k, v in
                               (values.get("fit_range") or {}).items()}  # fmt: skip
        values["jitter"] = tuple(float(x) for x in values.get("jitter") or ())
        return LinearStepTime(**values)
    if kind == "roofline":
        return RooflineStepTime(ModelSpec(**_known(ModelSpec, data["model"])),
                                Hardware.from_dict(data["hardware"]))  # fmt: skip
    if kind == "role":
        return RoleStepTime(model_from_dict(data["prefill"]), model_from_dict(data["decode"]))
    raise ValueError(
        f"unknown step-time model kind {kind!r}; expected 'linear', 'roofline' or 'role'"
    )


def without_jitter(model: StepTimeModel) -> StepTimeModel:
    """``model`` with every step at its price (``--step-jitter off``)."""
    if isinstance(model, LinearStepTime) and model.jitter:
        return dataclasses.replace(model, jitter=())
    if isinstance(model, RoleStepTime):
        return RoleStepTime(without_jitter(model.prefill), without_jitter(model.decode))
    return model


def _known(cls: Any, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}
