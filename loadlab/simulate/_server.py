"""The simulated server's settings (``loadlab-server``'s flags, with their defaults).

Example::

    ServerConfig(mode="chunked", num_kv_blocks=2048, max_num_batched_tokens=512)
    ServerConfig(mode="disaggregated", prefill_workers=1, decode_workers=1,
                 kv_bytes_per_token=16384, kv_transfer_bytes_per_s=1e9)
"""

from __future__ import annotations

from dataclasses import dataclass

from loadlab.errors import at_least

__all__ = ["FINISHED_SLOTS", "MODES", "ServerConfig"]

MODES = ("static", "continuous", "chunked", "disaggregated")
FINISHED_SLOTS = ("pad", "idle")


@dataclass(frozen=True)
class ServerConfig:
    """Defaults are ``loadlab-server``'s. ``max_num_batched_tokens`` None means the server's
    default: 512 in chunked mode, ``max(context, 8192)`` otherwise. ``num_kv_blocks`` has no
    default that fits every model: the CLI derives it from the model and hardware
    (``loadlab.simulate._setup``); in disaggregated mode every worker has that many.

    ``prefix_caching``: the reference server's automatic prefix caching (``prefix.py``), on
    by default as ``--prefix-caching on`` is; in disaggregated mode the prefill workers'.

    Disaggregated mode: ``prefill_workers`` and ``decode_workers`` engine loops, a prefill
    worker holding at most ``max_held`` (default ``max_num_seqs``) prefilled requests for
    pulling, and each KV transfer taking ``kv_transfer_latency_s + bytes /
    kv_transfer_bytes_per_s`` with ``bytes = prompt tokens * kv_bytes_per_token``.
    """

    mode: str = "continuous"
    num_kv_blocks: int = 4096
    block_size: int = 16
    max_num_seqs: int = 32
    max_model_len: int = 4096
    max_num_batched_tokens: int | None = None
    chunk_size: int = 256
    static_finished: str = "pad"
    max_queue: int = 1024  # requests waiting beyond max_num_seqs before a 429
    prefill_workers: int = 1
    decode_workers: int = 1
    max_held: int | None = None
    kv_bytes_per_token: int = 0
    kv_transfer_bytes_per_s: float = 1e9
    kv_transfer_latency_s: float = 0.001
    prefix_caching: bool = True  # the server's --prefix-caching on (disaggregated: prefill side)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.static_finished not in FINISHED_SLOTS:
            raise ValueError(f"static_finished must be pad or idle, got {self.static_finished!r}")
        for name in ("num_kv_blocks", "block_size", "max_num_seqs", "chunk_size",
                     "prefill_workers", "decode_workers"):  # fmt: skip
            at_least(name, getattr(self, name), 1)
        at_least("max_model_len", self.max_model_len, 2)
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        at_least("max_queue", self.max_queue, 0)
        if self.max_held is not None:
            at_least("max_held", self.max_held, 1)
        if self.kv_bytes_per_token < 0 or not self.kv_transfer_bytes_per_s > 0:
            raise ValueError("kv_bytes_per_token must be >= 0 and kv_transfer_bytes_per_s > 0")
        if self.kv_transfer_latency_s < 0:
            raise ValueError("kv_transfer_latency_s must be >= 0")

    @property
    def context_tokens(self) -> int:
        """``max_model_len`` capped to what the KV cache holds, as the server caps it (so one
        request always fits alone)."""
        return min(self.max_model_len, self.num_kv_blocks * self.block_size)

    @property
    def caching(self) -> bool:
        """Whether the prefix cache is modelled (disaggregated: by the prefill workers; the
        decode side receives every prompt's KV whole and has none, as in the server)."""
        return self.prefix_caching

    @property
    def batched_tokens(self) -> int:
        """The effective per-step token cap (the server's default when None)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 512 if self.mode == "chunked" else max(self.context_tokens, 8192)

    @property
    def held_cap(self) -> int:
        return self.max_held if self.max_held is not None else self.max_num_seqs

    def kv_transfer_s(self, tokens: int) -> float:
        """Seconds to move ``tokens`` tokens' KV from a prefill to a decode worker."""
        nbytes = tokens * self.kv_bytes_per_token
        return self.kv_transfer_latency_s + nbytes / self.kv_transfer_bytes_per_s
