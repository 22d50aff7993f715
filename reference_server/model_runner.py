"""Runs one scheduler step on the model: flatten the batch, write and read the paged KV cache,
run one forward pass, sample.

The contract with the scheduler is ``reference_server/sequence.py``: each ``ScheduledSeq``
asks to process ``seq.token_ids[num_computed_tokens : num_computed_tokens + num_new_tokens]``;
whole prompts, prompt slices (chunked prefill), recomputation after preemption and decode
tokens are all the same thing here, and all of a step's tokens go through the weights in one
forward pass, so decode reads each weight once per step for the whole batch.

Images: a sequence's ``images`` name the prompt positions whose input vectors come from the
image encoder (``model.PatchEmbed``) instead of the token embeddings; each step embeds the
image tiles of the positions it processes, so a chunked prefill may split an image.

KV cache: one tensor ``[n_layers, 2 (K, V), num_blocks, block_size, n_kv_heads, head_dim]``.
Token ``p`` of a sequence lives in slot ``block_table[p // block_size] * block_size +
p % block_size`` of the flattened ``[num_blocks * block_size, n_kv_heads, head_dim]`` view.

Usage::

    runner = ModelRunner("tiny", num_kv_blocks=64)
    seq = Sequence("r1", [72, 105], SamplingParams(max_tokens=4))
    seq.block_table = [0]                      # normally the block manager's job
    runner.run(ScheduledBatch([ScheduledSeq(seq, 2)]))   # -> [next_token_id]
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from reference_server.checks import at_least
from reference_server.model import (
    PRESETS,
    ModelArgs,
    PatchEmbed,
    Transformer,
    default_device_dtype,
    dense_attention,
    init_weights,
)
from reference_server.sampling import Sampler
from reference_server.sequence import ScheduledBatch, ScheduledSeq, Sequence
from reference_server.tokenizer import ByteTokenizer
from reference_server.vision import PATCH, Image

__all__ = ["ModelRunner", "resolve_args"]

_DEFAULT_CPU_KV_BYTES = 1 << 30  # 1 GiB: thousands of 4k-token contexts for the cpu preset
_GPU_KV_FRACTION = 0.8  # of the free memory left after the weights are loaded
_SMALL_MODEL_PARAMS = 5_000_000  # below this, default to one torch thread


TEXT_OUTPUT_IDS = [10, *range(32, 127)]  # "\n" and printable ASCII


def gpu_kv_bytes(free: int, total: int, own: int, share: float = 1.0) -> int:
    """A GPU KV cache's default size: ``_GPU_KV_FRACTION`` of the memory free once the weights
    (``own``: what this process holds) are loaded. ``share`` < 1 where processes of one server
    share the device (disaggregated workers): each takes that share of the device's fraction
    less its own weights, whatever the others already took, so neither start order nor a
    race between their starts decides who gets the memory; never more than is free now.

    >>> GiB = 2**30
    >>> gpu_kv_bytes(100 * GiB, 140 * GiB, 2 * GiB) // GiB  # alone: 0.8 of what is free
    80
    >>> gpu_kv_bytes(100 * GiB, 140 * GiB, 2 * GiB, 0.5) // GiB  # half of 0.8 x 140, less 2
    54
    >>> gpu_kv_bytes(40 * GiB, 140 * GiB, 2 * GiB, 0.5) // GiB  # the other took more: what is free
    32
    """
    if share >= 1:
        return int(free * _GPU_KV_FRACTION)
    return max(0, int(min(free * _GPU_KV_FRACTION, total * _GPU_KV_FRACTION * share - own)))


def resolve_args(preset: str | ModelArgs) -> ModelArgs:
    """ModelArgs of a preset name (or the args themselves)."""
    if isinstance(preset, ModelArgs):
        return preset
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[preset]


@dataclass
class _StepMeta:
    """Index tensors of one step, shared by every layer."""

    slots: Tensor  # [T] cache slot of each new token
    decode_rows: Tensor | None  # [Bd] rows of single-token items (None: no such item)
    decode_all: bool  # every item is a single token, rows 0..T-1 in order
    decode_blocks: Tensor | None  # [Bd * nb] block ids of each decode item, padded to nb
    decode_mask: Tensor | None  # [Bd, 1, 1, nb * block_size] additive: 0 attended, -inf not
    prefills: list[tuple[int, int, Tensor | None, Tensor | None]]
    # (first row, n_new, blocks [nblk] or None, mask [n_new, nblk * block_size] or None)


class ModelRunner:
    """The model, its paged KV cache and a sampler; ``run`` executes one ScheduledBatch."""

    def __init__(
        self,
        preset: str | ModelArgs = "tiny",
        *,
        num_kv_blocks: int | None = None,
        kv_cache_bytes: int | None = None,
        block_size: int = 16,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        seed: int = 0,
        threads: int | None = None,
        kv_share: float = 1.0,
    ) -> None:
        self.args = resolve_args(preset)
        if not 0 < kv_share <= 1:
            raise ValueError(f"kv_share must be in (0, 1], got {kv_share}")
        self._kv_share = kv_share
        self.preset = preset if isinstance(preset, str) else "custom"
        at_least("block_size", block_size, 1)
        if threads is None and self.args.num_params < _SMALL_MODEL_PARAMS:
            # A tiny model's ops are too small to split; on a busy machine OpenMP threads
            # waiting for each other made the tests 20x slower (measured, 2 cores, load 9).
            threads = 1
        if threads is not None:
            at_least("threads", threads, 1)
            torch.set_num_threads(threads)
        dev, dt = default_device_dtype()
        self.device = torch.device(device) if device is not None else dev
        if self.device.type != dev.type and dtype is None:
            dt = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.dtype = dtype if dtype is not None else dt
        self.block_size = block_size
        self.tokenizer = ByteTokenizer()
        if self.args.vocab_size < self.tokenizer.vocab_size:
            raise ValueError(f"vocab_size must be >= {self.tokenizer.vocab_size} (byte tokenizer)")
        a = self.args
        self.kv_bytes_per_token = 2 * a.n_layers * a.n_kv_heads * a.head_dim * self.dtype.itemsize

        model = Transformer(a, self.device)
        encoder = PatchEmbed(a.dim, PATCH, self.device)
        init_weights(model, seed, encoder)
        self.model = model.to(self.dtype).eval()
        self.model.rope_cos = self.model.rope_cos.float()  # keep the rotary tables exact
        self.model.rope_sin = self.model.rope_sin.float()
        self.model.prepack()  # CPU fp32: oneDNN's packed matmuls
        self.image_encoder = encoder.to(self.dtype).eval()
        self.image_encoder.proj.prepack()

        self.num_kv_blocks = self._num_blocks(num_kv_blocks, kv_cache_bytes)
        # [L, 2, num_blocks, block_size, KVH, hd]; zeros, not empty: padded keys are masked,
        # but their values still enter the softmax-weighted sum as 0 * v, and garbage could be NaN.
        self.kv_cache = torch.zeros(
            (a.n_layers, 2, self.num_kv_blocks, block_size, a.n_kv_heads, a.head_dim),
            dtype=self.dtype,
            device=self.device,
        )
        flat = self.kv_cache.view(a.n_layers, 2, -1, a.n_kv_heads, a.head_dim)
        self._k = [flat[i, 0] for i in range(a.n_layers)]  # [num_slots, KVH, hd] each
        self._v = [flat[i, 1] for i in range(a.n_layers)]
        self._kb = [self.kv_cache[i, 0] for i in range(a.n_layers)]  # [blocks, bs, KVH, hd]
        self._vb = [self.kv_cache[i, 1] for i in range(a.n_layers)]
        self.sampler = Sampler(
            eos_id=self.tokenizer.eos_id,
            num_byte_tokens=self.tokenizer.num_byte_tokens,
            vocab_size=a.vocab_size,
            seed=seed,
            device=self.device,
            # Generated text is printable ASCII (and newlines): one token is one character,
            # so every token becomes exactly one streamed chunk and clients' chunk counts
            # equal usage.completion_tokens (a random byte could be half a UTF-8 character).
            output_ids=TEXT_OUTPUT_IDS,
        )

    # ---------------------------------------------------------------- setup
    def _num_blocks(self, num_kv_blocks: int | None, kv_cache_bytes: int | None) -> int:
        block_bytes = self.kv_bytes_per_token * self.block_size
        if num_kv_blocks is not None:
            at_least("num_kv_blocks", num_kv_blocks, 1)
            return num_kv_blocks
        if kv_cache_bytes is None:
            kv_cache_bytes = self._default_kv_bytes()
        blocks = kv_cache_bytes // block_bytes
        if blocks < 1:
            raise ValueError(
                f"kv_cache_bytes={kv_cache_bytes} holds no block of {block_bytes} bytes; "
                "give at least one block's worth"
            )
        return int(blocks)

    def _default_kv_bytes(self) -> int:
        if self.device.type == "cuda":
            free_bytes, total_bytes = torch.cuda.mem_get_info(self.device)
            own = torch.cuda.memory_allocated(self.device)
            return gpu_kv_bytes(free_bytes, total_bytes, own, self._kv_share)
        # Enough for 64 full-length sequences, at most 1 GiB and a quarter of free RAM.
        full = 64 * self.args.max_seq_len * self.kv_bytes_per_token
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            avail = 4 * _DEFAULT_CPU_KV_BYTES
        return int(min(full, _DEFAULT_CPU_KV_BYTES, avail // 4))

    def info(self) -> dict[str, object]:
        """What is loaded, for /metrics, /v1/models and results files."""
        return {
            "preset": self.preset,
            "num_params": self.args.num_params,
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "num_kv_blocks": self.num_kv_blocks,
            "block_size": self.block_size,
            "max_seq_len": self.args.max_seq_len,
        }

    # ---------------------------------------------------------------- pooling
    @torch.inference_mode()
    def pool(self, token_lists: list[list[int]]) -> Tensor:
        """Unit-length embeddings [N, dim] (fp32) of whole sequences: each one's final-norm
        hidden states averaged over its tokens, from one forward pass per sequence with plain
        causal attention (no KV cache: nothing is generated, nothing is kept)."""
        out = []
        vocab = self.args.vocab_size
        for ids in token_lists:
            if any(not 0 <= i < vocab for i in ids):
                raise ValueError(f"token ids must be from 0 to {vocab - 1}")
            tok_t = torch.tensor(ids, device=self.device)  # [T]
            pos_t = torch.arange(len(ids), device=self.device)
            h = self.model(tok_t, pos_t, dense_attention)  # [T, D]
            v = self.model.norm(h).float().mean(dim=0)  # [D]
            out.append(v / v.norm().clamp_min(1e-12))
        return torch.stack(out) if out else torch.empty(0, self.args.dim)

    # ---------------------------------------------------------------- one step
    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[int | None]:
        """Process every item's new tokens in one forward pass; the next token of each item
        that completes its sequence's known tokens, else None. Never mutates the sequences."""
        done, logits = self.logits(batch)
        out: list[int | None] = [None] * len(batch.items)
        if done:
            sampled = self.sampler.sample(logits, [batch.items[i].seq for i in done])
            for i, t in zip(done, sampled, strict=True):
                out[i] = t
        return out

    @torch.inference_mode()
    def logits(self, batch: ScheduledBatch) -> tuple[list[int], Tensor]:
        """The forward pass of ``run`` without sampling: indices of the items that complete
        their sequence, and their next-token logits [len(indices), vocab_size] (fp32)."""
        items = batch.items
        dev = self.device
        if not items:
            return [], torch.empty(0, self.args.vocab_size, device=dev)
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        for it in items:
            self._append_item(it, tokens, positions, slots)
        meta = self._step_meta(items, torch.tensor(slots, device=dev))
        tok_t = torch.tensor(tokens, device=dev)
        pos_t = torch.tensor(positions, device=dev)

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return self._attend(meta, layer, q, k, v)

        h = self.model(tok_t, pos_t, attend, self._image_embeds(items))  # [T, D]
        rows, done = [], []
        row = 0
        for i, it in enumerate(items):
            row += it.num_new_tokens
            if it.completes:
                rows.append(row - 1)
                done.append(i)
        if not done:
            return [], torch.empty(0, self.args.vocab_size, device=dev)
        last = h if len(rows) == h.shape[0] else h[torch.tensor(rows, device=dev)]
        return done, self.model.logits(last)  # [N, V] fp32

    def _append_item(
        self, it: ScheduledSeq, tokens: list[int], positions: list[int], slots: list[int]
    ) -> None:
        seq, n = it.seq, it.num_new_tokens
        start = seq.num_computed_tokens
        end = start + n
        if n < 1 or end > seq.num_tokens:
            raise ValueError(
                f"{seq.seq_id}: cannot process tokens [{start}, {end}) of {seq.num_tokens}"
            )
        if end > self.args.max_seq_len:
            raise ValueError(
                f"{seq.seq_id}: {end} tokens exceed max_seq_len {self.args.max_seq_len}"
            )
        bs, bt = self.block_size, seq.block_table
        if len(bt) * bs < end:
            raise ValueError(
                f"{seq.seq_id}: block table holds {len(bt) * bs} tokens, step needs {end}"
            )
        tokens.extend(_token_slice(seq, start, n))
        if n == 1:
            positions.append(start)
            slots.append(bt[start // bs] * bs + start % bs)
        else:
            positions.extend(range(start, end))
            slots.extend(bt[p // bs] * bs + p % bs for p in range(start, end))

    def _image_embeds(self, items: list[ScheduledSeq]) -> tuple[Tensor, Tensor] | None:
        """(rows [N], vectors [N, dim]): the patch embeddings of every image token this step
        processes (a chunked prefill may take part of an image), or None when there is none."""
        rows: list[int] = []
        tiles: list[Tensor] = []
        row = 0
        for it in items:
            start, n = it.seq.num_computed_tokens, it.num_new_tokens
            for first, image in it.seq.images:
                lo, hi = max(start, first), min(start + n, first + image.num_tokens)
                if lo < hi:
                    rows.extend(range(row + lo - start, row + hi - start))
                    tiles.append(self._tiles(image)[lo - first : hi - first])
            row += n
        if not rows:
            return None
        vectors = self.image_encoder(torch.cat(tiles))  # [N, 3 * patch^2] -> [N, D]
        return torch.tensor(rows, device=self.device), vectors

    def _tiles(self, image: Image) -> Tensor:
        """An image's tiles [num_tokens, 3 * patch^2], in its image tokens' order."""
        rgb = torch.frombuffer(bytearray(image.rgb), dtype=torch.uint8)  # a writable copy
        rgb = rgb.view(image.height, image.width, 3).to(self.device)
        return self.image_encoder.tiles(rgb)

    def _step_meta(self, items: list[ScheduledSeq], slots: Tensor) -> _StepMeta:
        dev, bs = self.device, self.block_size
        dec_rows: list[int] = []
        dec_lens: list[int] = []
        dec_tables: list[list[int]] = []
        prefills: list[tuple[int, int, Tensor | None, Tensor | None]] = []
        row = 0
        for it in items:
            seq, n = it.seq, it.num_new_tokens
            start = seq.num_computed_tokens
            if n == 1:
                dec_rows.append(row)
                dec_lens.append(start + 1)
                dec_tables.append(seq.block_table[: (start + bs) // bs])
            elif start == 0:
                prefills.append((row, n, None, None))  # attends to its own fresh K/V only
            else:
                nblk = (start + n + bs - 1) // bs
                blocks = torch.tensor(seq.block_table[:nblk], device=dev)
                pos = torch.arange(nblk * bs, device=dev)
                q_pos = torch.arange(start, start + n, device=dev)
                mask = pos[None, :] <= q_pos[:, None]  # [n, nblk * bs], causal with offset
                prefills.append((row, n, blocks, mask))
            row += n
        meta = _StepMeta(slots, None, False, None, None, prefills)
        if dec_rows:
            nb = (max(dec_lens) + bs - 1) // bs
            padded = [b for t in dec_tables for b in (*t, *[0] * (nb - len(t)))]
            meta.decode_blocks = torch.tensor(padded, device=dev)  # [Bd * nb]
            j = torch.arange(nb * bs, device=dev)
            lens = torch.tensor(dec_lens, device=dev)
            # Additive float mask built once per step (a bool mask is converted in every layer).
            bias = torch.zeros(len(dec_lens), nb * bs, device=dev, dtype=self.dtype)
            bias.masked_fill_(j[None, :] >= lens[:, None], float("-inf"))
            meta.decode_mask = bias[:, None, None, :]  # [Bd, 1, 1, nb * bs]
            meta.decode_all = len(dec_rows) == row
            meta.decode_rows = None if meta.decode_all else torch.tensor(dec_rows, device=dev)
        return meta

    def _attend(self, meta: _StepMeta, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # q: [T, H, hd]; k, v: [T, KVH, hd] -> [T, H, hd]
        self._k[layer].index_copy_(0, meta.slots, k)  # [num_slots, KVH, hd]
        self._v[layer].index_copy_(0, meta.slots, v)
        kb, vb = self._kb[layer], self._vb[layer]  # [num_blocks, block_size, KVH, hd]
        blocks, mask, rows = meta.decode_blocks, meta.decode_mask, meta.decode_rows
        if meta.decode_all and blocks is not None:
            return _attend_decode(q, kb, vb, blocks, mask)
        out = torch.empty_like(q)
        if blocks is not None and rows is not None:
            out[rows] = _attend_decode(q[rows], kb, vb, blocks, mask)
        for row, n, blocks, mask in meta.prefills:
            # 4-D inputs: with 3-D ones torch's CPU SDPA falls back to the math kernel, which
            # materialises [H, n, n] scores (6x slower at 1,024 tokens, measured).
            qi = q[row : row + n].transpose(0, 1)[None]  # [1, H, n, hd]
            if blocks is None:  # a whole prompt from position 0: its own K/V, plain causal
                ki, vi = k[row : row + n], v[row : row + n]
            else:  # a later slice: all earlier K/V come from the cache, whole blocks
                ki = kb.index_select(0, blocks).flatten(0, 1)
                vi = vb.index_select(0, blocks).flatten(0, 1)
            # ki, vi: [n or nblk * block_size, KVH, hd]
            o = F.scaled_dot_product_attention(
                qi,
                ki.transpose(0, 1)[None],
                vi.transpose(0, 1)[None],
                attn_mask=None if mask is None else mask[None, None],
                is_causal=blocks is None,
                enable_gqa=True,
            )  # [1, H, n, hd]
            out[row : row + n] = o[0].transpose(0, 1)
        return out

    # ---------------------------------------------------------------- KV transfer
    def _slots_of(self, seq: Sequence, num_tokens: int) -> Tensor:
        bs = self.block_size
        if len(seq.block_table) * bs < num_tokens:
            raise ValueError(
                f"{seq.seq_id}: block table holds {len(seq.block_table) * bs} tokens, "
                f"not {num_tokens}"
            )
        pos = torch.arange(num_tokens, device=self.device)
        bt = torch.tensor(seq.block_table, device=self.device, dtype=torch.long)
        return bt[pos // bs] * bs + pos % bs

    @torch.inference_mode()
    def export_kv(self, seq: Sequence, num_tokens: int | None = None) -> Tensor:
        """K/V of a sequence's first ``num_tokens`` (default: all computed) tokens:
        [n_layers, 2, num_tokens, n_kv_heads, head_dim], contiguous, on the runner's device."""
        n = seq.num_computed_tokens if num_tokens is None else num_tokens
        a = self.args
        flat = self.kv_cache.view(a.n_layers, 2, -1, a.n_kv_heads, a.head_dim)
        return flat.index_select(2, self._slots_of(seq, n))  # a fresh contiguous copy

    @torch.inference_mode()
    def import_kv(self, seq: Sequence, kv: Tensor) -> None:
        """Write ``kv`` (export_kv's layout) into ``seq.block_table``'s slots. The caller then
        sets ``seq.num_computed_tokens`` to ``kv.shape[2]``."""
        a = self.args
        want = (a.n_layers, 2, a.n_kv_heads, a.head_dim)
        if kv.dim() != 5 or (kv.shape[0], kv.shape[1], kv.shape[3], kv.shape[4]) != want:
            raise ValueError(
                f"kv must be [n_layers, 2, n_tokens, n_kv_heads, head_dim] = "
                f"[{want[0]}, 2, n, {want[2]}, {want[3]}], got {list(kv.shape)}"
            )
        flat = self.kv_cache.view(a.n_layers, 2, -1, a.n_kv_heads, a.head_dim)
        flat.index_copy_(2, self._slots_of(seq, kv.shape[2]), kv.to(self.device, self.dtype))


def _attend_decode(
    q: Tensor, kb: Tensor, vb: Tensor, blocks: Tensor, mask: Tensor | None
) -> Tensor:
    """One query per sequence against its keys gathered from the cache, padded to the longest.

    q: [Bd, H, hd]; kb, vb: [num_blocks, block_size, KVH, hd]; blocks: [Bd * nb];
    mask: [Bd, 1, 1, nb * block_size].
    """
    # Gather whole blocks with index_select: contiguous block_size-row copies (advanced
    # indexing per slot, kc[slots], was 9x slower on CPU, and per-slot index_select 2x).
    bd = q.shape[0]
    keys = kb.index_select(0, blocks).view(bd, -1, *kb.shape[2:]).transpose(1, 2)
    vals = vb.index_select(0, blocks).view(bd, -1, *vb.shape[2:]).transpose(1, 2)
    # keys, vals: [Bd, KVH, nb * block_size, hd]
    o = F.scaled_dot_product_attention(q.unsqueeze(2), keys, vals, attn_mask=mask, enable_gqa=True)
    return o.squeeze(2)  # [Bd, H, hd]


def _token_slice(seq: Sequence, start: int, n: int) -> list[int]:
    """seq.token_ids[start:start + n] without concatenating prompt and output every step."""
    prompt, output = seq.prompt_token_ids, seq.output_token_ids
    p = len(prompt)
    if start >= p:
        return output[start - p : start - p + n]
    if start + n <= p:
        return prompt[start : start + n]
    return prompt[start:] + output[: start + n - p]
