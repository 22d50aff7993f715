"""Calibration with kernels shaped like one model's: what this machine achieves on *its* work.

A datasheet roofline (or the square-matmul / memory-copy calibration of ``calibrate.py``)
assumes every matmul runs at one FLOP/s and every byte moves at one bandwidth. On a CPU the
achieved rate depends strongly on the shape: a [1, 768] x [768, 4096] product streams the
matrix at memory speed, a [2048, 768] x [768, 4096] one runs near the GEMM peak, and the
range between them is neither. So this module times, on this machine:

- ``matmul_s[m]``: every weight matrix of the model (all layers, distinct copies, so they
  stream from memory as in a real forward pass) applied to ``m`` token rows with the reference
  server's own ``Linear`` (on a CPU in fp32, oneDNN's packed kernel from 2 rows up): the
  achieved cost of the 2 * N * m matmul FLOPs over the N * bytes weights;
- ``copy_bytes_per_s``: a large copy (read + write bytes per second), which prices the K/V
  gather the reference server's attention does before it attends;
- ``attention_flops_per_s``: causal ``scaled_dot_product_attention`` at the model's head
  shape and one length, priced per FLOP and extrapolated to other lengths by the FLOP count.

None of these runs the model; ``measured.py`` compares their sum with the model's step time.

Example::

    cal = calibrate_shapes(get_model("ref-cpu"), token_counts=[1, 8, 512])
    cal.matmul_s[8]      # seconds of all matmuls of a forward pass over 8 tokens
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from loadlab._capacity.calibrate import best_time_s
from loadlab._capacity.models import ModelSpec

__all__ = ["ShapeCalibration", "ShapedKernels", "calibrate_shapes", "weight_shapes"]


@dataclass(frozen=True)
class ShapeCalibration:
    matmul_s: dict[int, float]  # token rows -> seconds for one forward pass's matmuls
    copy_bytes_per_s: float
    attention_flops_per_s: float
    attention_tokens: int  # the length attention was measured at
    threads: int
    extra: dict[str, Any] = field(default_factory=dict)

    def matmul_flops_per_s(self, model: ModelSpec, tokens: int) -> float:
        """Achieved matmul FLOP/s at ``tokens`` rows (2 * N * tokens over the measured time)."""
        return 2.0 * model.matmul_params * tokens / self.matmul_s[tokens]

    def matmul_bytes_per_s(self, model: ModelSpec, tokens: int) -> float:
        """Achieved weight-streaming bytes/s at ``tokens`` rows."""
        return model.weight_bytes_read_per_step / self.matmul_s[tokens]


def weight_shapes(model: ModelSpec) -> list[tuple[int, int]]:
    """(out, in) of every matmul weight of one layer, as the reference model stores them:
    fused wqkv, wo, fused w13 (gate and up), w2."""
    d, hd = model.hidden_dim, model.head_dim
    qkv = (model.n_heads + 2 * model.n_kv_heads) * hd
    return [(qkv, d), (d, model.attn_dim), (2 * model.ffn_dim, d), (d, model.ffn_dim)]


class ShapedKernels:
    """The model's weights (random, distinct per layer) and kernels to time on them.

    Built once, then timed point by point, so a caller can interleave these timings with the
    measurement they predict (on a shared machine both then see the same load).
    """

    def __init__(
        self, model: ModelSpec, device: str = "cpu", clock: Callable[[], float] = time.perf_counter
    ) -> None:
        import torch
        import torch.nn.functional as F

        self.torch, self.F, self.model, self.device = torch, F, model, device
        self.clock = clock
        self.dtype = torch.float32 if model.dtype_bytes == 4 else torch.bfloat16
        self._gen = torch.Generator().manual_seed(0)
        # n_layers distinct copies of each layer's matrices, + the output head: [out, in] each.
        shapes = [s for _ in range(model.n_layers) for s in weight_shapes(model)]
        shapes.append((model.vocab_size, model.hidden_dim))
        self.linears = [self._linear(self._rand(o, i)) for o, i in shapes]
        self.weights = [lin.weight.t() for lin in self.linears]  # views, [out, in]

    def _linear(self, w: Any) -> Any:
        """The reference server's ``Linear`` (its layout and kernel choice) holding ``w``."""
        from reference_server.model import Linear

        out_features, in_features = w.shape
        lin = Linear(in_features, out_features, device=self.device)
        with self.torch.no_grad():
            lin.weight.data = w.t().contiguous()  # stored [in, out]
        lin.prepack()
        return lin

    def _rand(self, *shape: int) -> Any:
        return (self.torch.randn(*shape, generator=self._gen) * 0.02).to(self.device, self.dtype)

    def _sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def matmul_s(self, tokens: int, repeats: int = 5) -> float:
        """Fastest time of every matmul of one forward pass over ``tokens`` rows."""
        xs = {w.shape[1]: self._rand(tokens, w.shape[1]) for w in self.weights}  # [m, in]

        def forward() -> None:
            for w, lin in zip(self.weights, self.linears, strict=True):
                lin(xs[w.shape[1]])  # [m, in] x [in, out] -> [m, out]
            self._sync()

        with self.torch.inference_mode():
            return best_time_s(forward, repeats, clock=self.clock)

    def copy_bytes_per_s(self, repeats: int = 5) -> float:
        """Bytes read + written per second copying an array as large as the weights."""
        src = self.torch.ones(
            sum(w.numel() for w in self.weights), dtype=self.dtype, device=self.device
        )
        dst = self.torch.empty_like(src)

        def run() -> None:
            dst.copy_(src)
            self._sync()

        return 2.0 * src.numel() * src.element_size() / best_time_s(run, repeats, clock=self.clock)

    def decode_attention_s(self, batch: int, context: int, repeats: int = 5) -> float:
        """One decode step's attention over all layers, done the way the reference server does
        it (``reference_server.model_runner._attend_decode``, a paged-KV server without a fused
        kernel): gather each sequence's K/V blocks out of the block-laid cache into a padded
        copy, then masked grouped-query attention for one query per sequence."""
        from reference_server.model_runner import _attend_decode

        m, torch = self.model, self.torch
        bs = 16  # the server's default block size
        nb = -(-context // bs)
        # One cache per layer, as the server has, each read cold: in a real step every layer's
        # attention comes after its matmuls have streamed ~20 MB of weights through the CPU's
        # caches, so its K/V come from memory. Timed warm (a loop over one small cache, or a
        # best-of-N over caches that fit the last-level cache) it was 2x too cheap at batch 8.
        kvs = [
            (
                self._rand(batch * nb, bs, m.n_kv_heads, m.head_dim),  # [blocks, bs, KVH, hd]
                self._rand(batch * nb, bs, m.n_kv_heads, m.head_dim),
            )
            for _ in range(m.n_layers)
        ]
        blocks = torch.arange(batch * nb, device=self.device)  # [B * nb]
        mask = torch.zeros(batch, 1, 1, nb * bs, dtype=self.dtype, device=self.device)
        mask[..., context:] = float("-inf")
        q = self._rand(batch, m.n_heads, m.head_dim)  # [B, H, hd]
        flush = self._flush_buffer()

        def one_step() -> float:
            total = 0.0
            for kb, vb in kvs:
                flush.add_(1.0)  # evict (untimed), as the layer's matmuls would
                self._sync()
                t0 = self.clock()
                _attend_decode(q, kb, vb, blocks, mask)
                self._sync()
                total += self.clock() - t0
            return total

        with torch.inference_mode():
            one_step()  # warm-up
            return min(one_step() for _ in range(max(1, repeats)))

    def _flush_buffer(self) -> Any:
        """A buffer larger than any CPU's last-level cache (64 MiB), written to evict it."""
        if not hasattr(self, "_flush"):
            n = 64 * 2**20 // 4
            self._flush = self.torch.zeros(n, dtype=self.torch.float32, device=self.device)
        return self._flush

    def attention_flops_per_s(self, tokens: int = 512, repeats: int = 5) -> float:
        """Causal attention FLOP/s at the model's head shape over ``tokens`` tokens."""
        m, torch = self.model, self.torch
        # laid out as the model hands them over: [T, heads, hd] viewed as [1, heads, T, hd].
        # 4-D, as the server calls it: with 3-D inputs torch's CPU SDPA takes the math kernel
        # (it materialises [H, T, T] scores), which priced a 2048-token prefill at twice
        # its measured time.
        q = self._rand(tokens, m.n_heads, m.head_dim).transpose(0, 1)[None]  # [1, H, T, hd]
        k = self._rand(tokens, m.n_kv_heads, m.head_dim).transpose(0, 1)[None]
        v = self._rand(tokens, m.n_kv_heads, m.head_dim).transpose(0, 1)[None]

        def run() -> None:
            for _ in range(m.n_layers):
                self.F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            self._sync()

        with torch.inference_mode():
            t = best_time_s(run, repeats, clock=self.clock)
        # causal QK^T and AV: 4 * d_attn FLOPs per (query, key) pair, T(T+1)/2 pairs, per layer
        return 4.0 * m.n_layers * m.attn_dim * tokens * (tokens + 1) / 2 / t


def calibrate_shapes(
    model: ModelSpec,
    token_counts: Iterable[int],
    attention_tokens: int = 512,
    repeats: int = 5,
    device: str = "cpu",
) -> ShapeCalibration:
    """Time this model's matmul shapes at each token count, a copy, and causal attention."""
    k = ShapedKernels(model, device)
    return ShapeCalibration(
        matmul_s={m: k.matmul_s(m, repeats) for m in sorted(set(token_counts))},
        copy_bytes_per_s=k.copy_bytes_per_s(),
        attention_flops_per_s=k.attention_flops_per_s(attention_tokens, repeats),
        attention_tokens=attention_tokens,
        threads=k.torch.get_num_threads(),
        extra={"device": device, "dtype": str(k.dtype).removeprefix("torch.")},
    )
