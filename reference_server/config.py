"""``ServerConfig``: everything the reference server is built from (``cli.build_app``).

``cli.parse_args`` turns ``loadlab-server`` flags into one; tests build one directly, and
``to_argv`` turns one back into flags for a subprocess (``launch.RunningServer``).

Usage::

    config = ServerConfig(mode="chunked", preset="tiny", max_batched_tokens=64)
    app, engine, info = build_app(config)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["ServerConfig"]


@dataclass(frozen=True)
class ServerConfig:
    """One field per ``loadlab-server`` flag (``--max-num-seqs`` -> ``max_num_seqs``); the
    defaults are the CLI's. ``None``: the flag's documented default (see ``cli.py``)."""

    mode: str = "continuous"  # static, continuous, chunked or disaggregated
    preset: str = "cpu"  # tiny, cpu, 1b; fake = no model
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "loadlab-ref"
    max_num_seqs: int = 32
    kv_cache_mb: float | None = None  # at most one of kv_cache_mb and num_kv_blocks
    num_kv_blocks: int | None = None
    block_size: int = 16
    prefix_caching: str = "on"  # on or off
    max_model_len: int | None = None
    max_batched_tokens: int | None = None
    chunk_size: int = 256
    static_finished: str = "pad"
    max_queue: int = 1024
    api_key_env: str | None = None  # the name of the variable, never the key itself
    allow_unauthenticated: bool = False  # serve beyond loopback without a key, on purpose
    request_read_timeout: float = 30.0  # s for a request to arrive whole (deadline.py)
    threads: int | None = None
    seed: int = 0
    log_level: str = "warning"
    reasoning_tokens: int = 0  # reasoning model: the first N tokens of each answer
    tool_call_rate: float = 0.5
    # disaggregated mode
    prefill_workers: int = 1
    decode_workers: int = 1
    prefill_cpus: str | None = None
    decode_cpus: str | None = None
    prefill_nice: int | None = None
    max_held: int | None = None
    dist_init: str | None = None

    def __post_init__(self) -> None:
        if self.kv_cache_mb is not None and self.num_kv_blocks is not None:
            raise ValueError("set at most one of kv_cache_mb and num_kv_blocks")
        if self.prefix_caching not in ("on", "off"):
            raise ValueError(f"prefix_caching must be 'on' or 'off', got {self.prefix_caching!r}")

    def answer_settings(self) -> dict[str, Any]:
        """The ``ServerSettings`` fields of the answer's framing (reasoning, tool calls)."""
        return {"reasoning_tokens": self.reasoning_tokens, "tool_call_rate": self.tool_call_rate,
                "answer_seed": self.seed}  # fmt: skip

    def api_key(self) -> str | None:
        """The key from the environment variable ``api_key_env`` names (None: no auth)."""
        return os.environ[self.api_key_env] if self.api_key_env else None

    def to_argv(self) -> list[str]:
        """The ``loadlab-server`` flags for this config (fields left at their default are
        left out)."""
        argv: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                argv += [flag] if value else []
            elif value != f.default:
                argv += [flag, str(value)]
        return argv
