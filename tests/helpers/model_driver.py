"""A minimal stand-in for the scheduler side, so the runner is tested alone: a free list of
blocks and the postprocess step (advance num_computed_tokens, append the sampled token)."""

from __future__ import annotations

import random

import torch

from reference_server.model import dense_attention
from reference_server.model_runner import TEXT_OUTPUT_IDS, ModelRunner
from reference_server.sequence import SamplingParams, ScheduledBatch, ScheduledSeq, Sequence


class Driver:
    def __init__(self, runner: ModelRunner, shuffle_seed: int = 0) -> None:
        self.runner = runner
        self.free = list(range(runner.num_kv_blocks))
        random.Random(shuffle_seed).shuffle(self.free)  # block tables out of order on purpose

    def step(self, work: list[tuple[Sequence, int]]) -> list[int | None]:
        bs = self.runner.block_size
        for seq, n in work:
            need = -(-(seq.num_computed_tokens + n) // bs)
            while len(seq.block_table) < need:
                seq.block_table.append(self.free.pop())
        out = self.runner.run(ScheduledBatch([ScheduledSeq(s, n) for s, n in work]))
        for (seq, n), tok in zip(work, out, strict=True):
            seq.num_computed_tokens += n
            if tok is not None:
                seq.output_token_ids.append(tok)
        return out

    def preempt(self, seq: Sequence) -> None:
        """Free the sequence's blocks; it recomputes everything when it runs again."""
        self.free.extend(reversed(seq.block_table))
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1

    def decode(self, seqs: list[Sequence], steps: int) -> None:
        for _ in range(steps):
            self.step([(s, 1) for s in seqs])


def seq(seq_id: str, prompt: list[int], **params: object) -> Sequence:
    return Sequence(seq_id, list(prompt), SamplingParams(max_tokens=64, **params))  # type: ignore[arg-type]


def prompt_of(length: int, salt: int) -> list[int]:
    rng = random.Random(salt)
    return [rng.randrange(256) for _ in range(length)]


@torch.inference_mode()
def dense_forward(
    runner: ModelRunner,
    tokens: list[int],
    embeds: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: one full causal forward over ``tokens`` with no cache (``embeds``: input
    vectors replacing the token embeddings at some rows, as ``Transformer.forward`` takes them).

    Returns logits [T, V] and K/V [n_layers, 2, T, KVH, hd] (export_kv's layout).
    """
    kv: list[torch.Tensor] = []

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kv.append(torch.stack([k, v]))
        return dense_attention(layer, q, k, v)

    t = torch.tensor(tokens, device=runner.device)
    h = runner.model(t, torch.arange(len(tokens), device=runner.device), attend, embeds)
    return runner.model.logits(h), torch.stack(kv)


def assert_close(got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    """Max-abs-difference check (torch.testing imports torch.distributed: seconds at first use)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = float((got.float() - want.float()).abs().max()) if got.numel() else 0.0
    assert diff <= atol, f"max abs difference {diff:.3g} > {atol}"


def greedy_from_dense(runner: ModelRunner, s: Sequence) -> list[int]:
    """What greedy decoding with the dense reference would have produced for ``s``, checked by
    teacher forcing: one dense forward over prompt + outputs gives the argmax (over the ids the runner may generate,
    as with ignore_eos) after each prefix. Equal to s.output_token_ids iff step-by-step dense
    greedy generation gives the same tokens (by induction on the position)."""
    logits, _ = dense_forward(runner, s.token_ids)
    p = s.num_prompt_tokens
    allowed = torch.tensor(TEXT_OUTPUT_IDS)  # the ids the runner may generate
    best = logits[p - 1 : s.num_tokens - 1].index_select(-1, allowed).argmax(dim=-1)
    return allowed[best].tolist()
