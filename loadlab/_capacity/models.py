"""Model presets: the shapes a capacity estimate needs (no torch).

A ``ModelSpec`` holds what sets the cost of serving a decoder-only transformer: layers, hidden
size, query and KV heads, head size, FFN size, vocabulary and the bytes per weight. Presets
for three public Llama 3 models carry their published shapes; the reference server's presets
(``tiny``, ``cpu``, ``1b``) are read lazily from ``reference_server.model.PRESETS`` so the
harness never needs torch unless one of them is asked for.

Example::

    >>> m = get_model("llama-3-8b")
    >>> m.kv_bytes_per_token            # 2 (K and V) * 32 layers * 8 KV heads * 128 * 2 bytes
    131072
    >>> round(m.num_params / 1e9, 2)
    8.03
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any

from loadlab.errors import ConfigError, at_least
from loadlab.records import pick

__all__ = [
    "DTYPE_BYTES",
    "MODELS",
    "REFERENCE_PREFIX",
    "ModelSpec",
    "from_model_args",
    "get_model",
    "model_names",
]

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2,
                               "float16": 2, "fp8": 1, "int8": 1}  # fmt: skip
REFERENCE_PREFIX = "ref-"  # "ref-cpu" names the reference server's "cpu" preset
REFERENCE_NAMES = ("tiny", "cpu", "1b")  # also accepted bare


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of a Llama-style decoder (RMSNorm, GQA attention, SwiGLU FFN, no biases)."""

    name: str
    n_layers: int
    hidden_dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    dtype_bytes: int = 2  # bytes per weight and per KV element (bf16 = 2)
    tied_embeddings: bool = False  # output head shares the embedding matrix (Llama-3.2-1B)
    source: str = ""

    def __post_init__(self) -> None:
        for f in ("n_layers", "hidden_dim", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                  "vocab_size", "dtype_bytes"):  # fmt: skip
            at_least(f"ModelSpec.{f}", getattr(self, f), 1, error=ConfigError)
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )

    @property
    def attn_dim(self) -> int:
        """Width of the attention (query) projection: n_heads * head_dim (Kaplan's d_attn)."""
        return self.n_heads * self.head_dim

    @property
    def params_per_layer(self) -> int:
        d, kv = self.hidden_dim, self.n_kv_heads * self.head_dim
        attn = d * self.attn_dim + 2 * d * kv + self.attn_dim * d  # wq, wk, wv, wo
        ffn = 3 * d * self.ffn_dim  # SwiGLU: gate, up, down (Shazeer 2020)
        return attn + ffn + 2 * d  # + the two RMSNorm gains

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_dim

    @property
    def num_params(self) -> int:
        """All parameters; the output head is counted once more unless tied."""
        head = 0 if self.tied_embeddings else self.embedding_params
        return (
            self.embedding_params + head + self.n_layers * self.params_per_layer + self.hidden_dim
        )

    @property
    def matmul_params(self) -> int:
        """Parameters a token multiplies through: every layer plus the output head.

        The embedding lookup reads one row per token, not the table, so it is excluded (as in
        Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1, who count
        non-embedding parameters N; we add the de-embedding head back since it is a real
        d_model x vocab matmul per token, their Table 1 row "De-embed").
        """
        return self.n_layers * self.params_per_layer + self.embedding_params + self.hidden_dim

    @property
    def weight_bytes(self) -> int:
        """Bytes of memory the weights occupy."""
        return self.num_params * self.dtype_bytes

    @property
    def weight_bytes_read_per_step(self) -> int:
        """Bytes of weights one forward pass streams from memory (all but the embedding table)."""
        return self.matmul_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache per token: 2 (K and V) * layers * KV heads * head_dim * bytes per element.

        Source: the "KV cache" section of Chen, "Transformer Inference Arithmetic" (kipp.ly,
        2022), adapted to grouped-query attention (Ainslie et al. 2023), where only the
        n_kv_heads heads are cached.
        """
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    def with_dtype_bytes(self, dtype_bytes: int) -> ModelSpec:
        return dataclasses.replace(self, dtype_bytes=dtype_bytes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(num_params=self.num_params, kv_bytes_per_token=self.kv_bytes_per_token)
        return d


def _llama3(
    name: str, repo: str, n_layers: int, hidden_dim: int, n_heads: int, ffn_dim: int, **kw: Any
) -> ModelSpec:
    """A Llama 3 shape from its Hugging Face ``config.json``: the family shares the
    128,256-token vocabulary and 8 KV heads, and head_dim = hidden_size / num_attention_heads
    (the Transformers default the configs rely on)."""
    return ModelSpec(name, n_layers=n_layers, hidden_dim=hidden_dim, n_heads=n_heads,
                     n_kv_heads=8, head_dim=hidden_dim // n_heads, ffn_dim=ffn_dim,
                     vocab_size=128256, source=f"meta-llama/{repo} config.json", **kw)  # fmt: skip


# Published shapes: the config.json of each model on the Hugging Face Hub
# (meta-llama/Meta-Llama-3-8B, meta-llama/Meta-Llama-3-70B, meta-llama/Llama-3.2-1B) and the
# Llama 3 paper (Grattafiori et al. 2024, "The Llama 3 Herd of Models", Table 3).
# Columns: name, Hub repo, n_layers, hidden_dim, n_heads, ffn_dim.
MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    _llama3("llama-3-8b", "Meta-Llama-3-8B", 32, 4096, 32, 14336),  # 8.03 B parameters
    _llama3("llama-3-70b", "Meta-Llama-3-70B", 80, 8192, 64, 28672),  # 70.6 B parameters
    _llama3("llama-3.2-1b", "Llama-3.2-1B", 16, 2048, 32, 8192,
            tied_embeddings=True),  # 1.24 B parameters
)}  # fmt: skip
_ALIASES = {"llama3-8b": "llama-3-8b", "llama-3.1-8b": "llama-3-8b", "llama3-70b": "llama-3-70b",
            "llama-3.1-70b": "llama-3-70b", "llama3.2-1b": "llama-3.2-1b"}  # fmt: skip


def from_model_args(name: str, args: Any, dtype_bytes: int = 4) -> ModelSpec:
    """A ``ModelSpec`` from a ``reference_server.model.ModelArgs`` (untied head, as there)."""
    return ModelSpec(
        name=name,
        hidden_dim=args.dim,
        dtype_bytes=dtype_bytes,
        source="reference_server.model.PRESETS",
        **pick(args, "n_layers n_heads n_kv_heads head_dim ffn_dim vocab_size"),
    )


def _reference_presets() -> tuple[dict[str, Any], str | None]:
    """The reference server's presets, or ({}, why not) when it cannot be imported."""
    try:
        # imports torch: only when asked for (and not followed by mypy: the harness's types
        # stop at the server's boundary)
        presets = importlib.import_module("reference_server.model").PRESETS
    except ImportError as exc:
        return {}, str(exc)
    return dict(presets), None


def get_model(name: str, dtype_bytes: int | None = None) -> ModelSpec:
    """A preset by name: a Llama 3 model, or ``ref-<preset>`` (bare ``cpu``/``tiny``/``1b`` too).

    Reference presets default to 4 bytes (fp32: the server's dtype on CPU); pass
    ``dtype_bytes=2`` for the bf16 the server uses on CUDA.
    """
    key = _ALIASES.get(name.lower(), name.lower())
    if key in MODELS:
        spec = MODELS[key]
        return spec if dtype_bytes is None else spec.with_dtype_bytes(dtype_bytes)
    ref = key.removeprefix(REFERENCE_PREFIX)
    if not key.startswith(REFERENCE_PREFIX) and ref not in REFERENCE_NAMES:
        # no torch import for a plain typo
        raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(model_names())}")
    presets, why_not = _reference_presets()
    if ref in presets:
        return from_model_args(REFERENCE_PREFIX + ref, presets[ref], dtype_bytes or 4)
    if why_not:
        raise ConfigError(
            f"{name!r} is a reference server preset, which needs torch and reference_server "
            f"({why_not}); or use one of {', '.join(MODELS)}"
        )
    raise ConfigError(f"unknown model {name!r}; choose one of {', '.join(model_names(presets))}")


def model_names(reference_presets: dict[str, Any] | None = None) -> list[str]:
    refs = reference_presets if reference_presets is not None else REFERENCE_NAMES
    return [*MODELS, *(REFERENCE_PREFIX + p for p in refs)]
