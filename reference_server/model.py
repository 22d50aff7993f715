"""A Llama-style decoder in one readable file (after gpt-fast's ``model.py``).

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU feed-forward, with
seeded random weights (nothing is downloaded: the server exists to show serving physics, and a
random model costs exactly what a trained one of the same shape costs).

The model works on a *flat* batch: ``tokens`` [T] and ``positions`` [T] hold every token of
every sequence in the step back to back, so each weight matrix is read once per step however
many sequences share it. Attention is the only place where sequences differ, so the caller
passes it in as a function (paged attention in ``model_runner.py``; plain causal attention in
``dense_attention`` for references and tests).

Usage::

    args = PRESETS["tiny"]
    model = Transformer(args).eval()
    init_weights(model, seed=0)
    tokens = torch.tensor([1, 2, 3]); pos = torch.arange(3)
    h = model(tokens, pos, dense_attention)      # [3, dim]
    logits = model.logits(h)                      # [3, vocab_size]

Images: ``PatchEmbed`` projects an image's tiles to the model's width, and ``forward`` takes
those vectors in place of the token embeddings at the image tokens' rows (``embeds``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from reference_server.checks import at_least

__all__ = [
    "PRESETS",
    "AttentionFn",
    "ModelArgs",
    "PatchEmbed",
    "Transformer",
    "default_device_dtype",
    "dense_attention",
    "init_weights",
]

# (layer index, q [T, n_heads, head_dim], k [T, n_kv_heads, head_dim], v [T, n_kv_heads, head_dim])
#   -> attention output [T, n_heads, head_dim]
AttentionFn = Callable[[int, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int = 320
    max_seq_len: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size"):
            at_least(f"ModelArgs.{name}", getattr(self, name), 1)
        if self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
        at_least("max_seq_len", self.max_seq_len, 2)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def num_params(self) -> int:
        """Exact parameter count (embedding and output head untied, both counted)."""
        hd = self.head_dim
        attn = self.dim * hd * (self.n_heads + 2 * self.n_kv_heads) + self.n_heads * hd * self.dim
        ffn = 3 * self.dim * self.ffn_dim
        per_layer = attn + ffn + 2 * self.dim  # + attention_norm and ffn_norm weights
        return 2 * self.vocab_size * self.dim + self.n_layers * per_layer + self.dim

    @property
    def num_non_embedding_params(self) -> int:
        """Parameters touched by matmuls per token (all but the embedding lookup table)."""
        return self.num_params - self.vocab_size * self.dim


PRESETS: dict[str, ModelArgs] = {
    # Tests: a few ms per step on CPU, GQA (4 query heads share 2 KV heads).
    "tiny": ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192, max_seq_len=1024),
    # A 2-core CPU: ~46 M parameters = 185 MB of fp32 weights, 5.8x a 32 MiB L3, so
    # every decode step streams the weights from DRAM (memory-bound) while a 128-token prefill
    # does 128 tokens of matmul per weight byte (compute-bound). See
    # docs/reference-server-physics.md for the measurements.
    "cpu": ModelArgs(dim=768, n_layers=8, n_heads=12, n_kv_heads=4, ffn_dim=2048),
    # One GPU: Llama-3.2-1B shapes (dim 2048, 16 layers, 32/8 heads, ffn 8192) with a byte
    # vocabulary, so ~0.97 B parameters (Llama's 128k-token embeddings are most of the rest).
    "1b": ModelArgs(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim=8192,
        max_seq_len=8192,
        rope_theta=500000.0,
    ),
}


def default_device_dtype() -> tuple[torch.device, torch.dtype]:
    """CUDA with bf16 when present, else CPU with fp32."""
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16
    return torch.device("cpu"), torch.float32


# Modules take ``device`` explicitly: the ``with torch.device(...)`` context manager imports
# torch's function-mode machinery on first use, which costs seconds at startup.
Device = torch.device | str | None


class Linear(nn.Module):
    """``y = x @ weight`` with ``weight`` stored [in_features, out_features], the transpose of
    ``nn.Linear``'s layout: MKL's one-row (decode at batch 1) fp32 matmul ran 1.3-1.6x faster
    this way on the 2-core test machine; cuBLAS takes either layout.

    On a CPU in fp32, ``prepack()`` also keeps a copy of the weight in oneDNN's packed layout,
    used for 2 rows and more. MKL's fp32 GEMM for a handful of rows ran near-compute-bound on
    the AMD test machine (4 rows cost 3-4x one row); oneDNN's packed kernel streams the weights
    once for up to ~8 rows, which is the memory-bound decode the lesson describes (measured in
    docs/reference-server-physics.md: decode batch 4 cost 3.1 vs 10.7 ms per layer, batch 32
    5.9 vs 10.3 ms, 2 threads).
    """

    def __init__(self, in_features: int, out_features: int, device: Device = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features, device=device))
        self._packed: Tensor | None = None

    def prepack(self) -> bool:
        """Pack the current weight for oneDNN (CPU, fp32, oneDNN present); call again after
        changing the weight. Returns whether a packed copy is now used."""
        w = self.weight
        self._packed = None
        if w.device.type == "cpu" and w.dtype == torch.float32 and _onednn_linear_available():
            with torch.no_grad():
                # [out, in], as oneDNN's linear expects it
                self._packed = torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), None)
        return self._packed is not None

    def forward(self, x: Tensor) -> Tensor:
        if self._packed is not None and x.shape[0] > 1:
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")
        return x @ self.weight  # [T, in] @ [in, out] -> [T, out]


def _onednn_linear_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device: Device = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x: Tensor) -> Tensor:
        # x: [T, D]; Zhang & Sennrich 2019: x / rms(x) * g
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(args: ModelArgs, device: Device = None) -> tuple[Tensor, Tensor]:
    """cos, sin: [max_seq_len, head_dim]; Su et al. 2021 (RoFormer), "rotate half" layout."""
    half = args.head_dim // 2
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.outer(torch.arange(args.max_seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)  # [S, head_dim]
    return angles.cos().float().to(device), angles.sin().float().to(device)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [T, H, hd]; cos, sin: [T, 1, hd]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, device: Device = None) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        # q, k and v in one matmul (gpt-fast's wqkv): one weight read, one kernel.
        qkv_dim = (args.n_heads + 2 * args.n_kv_heads) * args.head_dim
        self.wqkv = Linear(args.dim, qkv_dim, device)
        self.wo = Linear(args.n_heads * args.head_dim, args.dim, device)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, layer: int, attend: AttentionFn
    ) -> Tensor:
        t = x.shape[0]
        hd, nq, nkv = self.head_dim, self.n_heads, self.n_kv_heads
        q, k, v = self.wqkv(x).split([nq * hd, nkv * hd, nkv * hd], dim=-1)  # [T, *]
        q = apply_rope(q.view(t, nq, hd), cos, sin)  # [T, H, hd]
        k = apply_rope(k.view(t, nkv, hd), cos, sin)  # [T, KVH, hd]
        out = attend(layer, q, k, v.view(t, nkv, hd))  # [T, H, hd]
        return self.wo(out.reshape(t, nq * hd))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs, device: Device = None) -> None:
        super().__init__()
        self.ffn_dim = args.ffn_dim
        # gate and up projections in one matmul
        self.w13 = Linear(args.dim, 2 * args.ffn_dim, device)
        self.w2 = Linear(args.ffn_dim, args.dim, device)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).split(self.ffn_dim, dim=-1)
        return self.w2(F.silu(gate) * up)  # SwiGLU, Shazeer 2020


class Block(nn.Module):
    def __init__(self, args: ModelArgs, device: Device = None) -> None:
        super().__init__()
        self.attention = Attention(args, device)
        self.feed_forward = FeedForward(args, device)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps, device)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps, device)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, layer: int, attend: AttentionFn
    ) -> Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, layer, attend)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    rope_cos: Tensor  # [max_seq_len, head_dim] buffers, registered in __init__
    rope_sin: Tensor

    def __init__(self, args: ModelArgs, device: Device = None) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim, device=device)
        self.layers = nn.ModuleList(Block(args, device) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps, device)
        self.output = Linear(args.dim, args.vocab_size, device)
        cos, sin = rope_tables(args, device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        attend: AttentionFn,
        embeds: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """Hidden states [T, dim] (before the final norm) of a flat batch of tokens [T].
        ``embeds`` = (rows [N], vectors [N, dim]): input vectors that replace the token
        embeddings at those rows (an image's patch embeddings)."""
        cos = self.rope_cos[positions].unsqueeze(1).to(self.output.weight.dtype)  # [T, 1, hd]
        sin = self.rope_sin[positions].unsqueeze(1).to(self.output.weight.dtype)
        x = self.tok_embeddings(tokens)  # [T, D]
        if embeds is not None:
            x = x.index_copy(0, embeds[0], embeds[1].to(x.dtype))
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, i, attend)
        return x

    def prepack(self) -> bool:
        """Pack every matmul weight for the CPU's fastest kernel (see ``Linear``); call after
        the weights and dtype are final. Returns whether packed weights are in use."""
        return all([m.prepack() for m in self.modules() if isinstance(m, Linear)])

    def logits(self, h: Tensor) -> Tensor:
        """Next-token logits [N, vocab_size] (fp32) of hidden states [N, dim]."""
        return self.output(self.norm(h)).float()


class PatchEmbed(nn.Module):
    """The image encoder: ViT's patch embedding (Dosovitskiy et al. 2020), a convolution whose
    stride is its kernel, written as one matmul over flattened ``patch`` x ``patch`` RGB tiles.

    ``tiles`` cuts an image [H, W, 3] (uint8) into tiles [n, 3 * patch * patch] (pixels to
    [-1, 1], partial tiles padded with black, row by row); ``forward`` projects tiles to
    [n, dim]. Its weights are not in ``ModelArgs.num_params`` (the language model's count).
    """

    def __init__(self, dim: int, patch: int, device: Device = None) -> None:
        super().__init__()
        self.patch = patch
        self.proj = Linear(3 * patch * patch, dim, device)

    def tiles(self, rgb: Tensor) -> Tensor:
        p = self.patch
        h, w, _ = rgb.shape
        x = F.pad(rgb, (0, 0, 0, -w % p, 0, -h % p))  # black: [H', W', 3] uint8
        hp, wp = x.shape[0] // p, x.shape[1] // p
        x = x.view(hp, p, wp, p, 3).permute(0, 2, 4, 1, 3)  # [hp, wp, 3, p, p], as a conv reads
        x = x.reshape(hp * wp, 3 * p * p).to(self.proj.weight.dtype)
        return x.mul_(1 / 127.5).sub_(1.0)  # pixels to [-1, 1]

    def forward(self, tiles: Tensor) -> Tensor:
        return self.proj(tiles)  # [n, 3 * p * p] -> [n, dim]


@torch.no_grad()
def init_weights(model: Transformer, seed: int, image_encoder: PatchEmbed | None = None) -> None:
    """Seeded random weights scaled so activations stay finite and outputs vary.

    Matrices ~ N(0, 0.02) as in GPT-2; residual output projections (wo, w2) scaled by
    1/sqrt(2 * n_layers) (GPT-2, Radford et al. 2019) so the residual stream does not grow with
    depth; the output head ~ N(0, 1/dim) so logits of the unit-RMS final state have std ~1
    (distinct greedy choices, not a near-uniform distribution). The embedding is N(0, 0.02)
    too: RMSNorm rescales it before every use. The image encoder's projection, drawn after
    the model's weights from the same generator (so a seed gives the same language model with or
    without it), is ~ N(0, 0.02 / sqrt(in_features)): a tile of unit-scale pixels then embeds
    at a token embedding's scale.
    """
    device = model.output.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)  # same weights per device type
    args = model.args
    resid_std = 0.02 / math.sqrt(2 * args.n_layers)
    params = list(model.named_parameters())
    if image_encoder is not None:
        params += [("image." + n, p) for n, p in image_encoder.named_parameters()]
    for name, p in params:
        if name.endswith("norm.weight"):
            p.fill_(1.0)
            continue
        std = 0.02
        if name.endswith(("wo.weight", "w2.weight")):
            std = resid_std
        elif name == "output.weight":
            std = 1.0 / math.sqrt(args.dim)
        elif name.startswith("image."):
            std = 0.02 / math.sqrt(p.shape[0])
        p.copy_(torch.randn(p.shape, generator=gen, device=device) * std)  # drawn in fp32


def dense_attention(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Plain causal attention over one sequence with no cache: the reference for paged attention.

    q: [T, H, hd], k, v: [T, KVH, hd] -> [T, H, hd].
    """
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    )  # [H, T, hd]
    return out.transpose(0, 1)
