"""Next-token sampling: greedy, or temperature + top-p with reproducible per-request seeds.

A seeded request draws each token from a generator seeded by (request seed, token position),
so the same request gives the same text in any batch, and a sequence recomputed after
preemption samples exactly what it sampled before. Only byte ids (and eos when the request
allows it) can be drawn; padding ids never appear.

Usage::

    sampler = Sampler(eos_id=256, num_byte_tokens=256, vocab_size=320, seed=0)
    sampler.sample(logits, seqs)   # logits [N, vocab_size] -> N token ids
"""

from __future__ import annotations

import torch
from torch import Tensor

from reference_server.sequence import Sequence

__all__ = ["Sampler", "position_seed"]

_MASK63 = (1 << 63) - 1


def position_seed(seed: int, position: int) -> int:
    """Generator seed for the token at ``position`` of a request seeded with ``seed``
    (a multiplicative hash, Knuth TAOCP 6.4, so neighbouring seeds do not share streams)."""
    return (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) & _MASK63


class Sampler:
    def __init__(
        self,
        *,
        eos_id: int,
        num_byte_tokens: int,
        vocab_size: int,
        seed: int = 0,
        device: torch.device | str = "cpu",
        output_ids: list[int] | None = None,
    ) -> None:
        self.eos_id = eos_id
        allowed = torch.full((vocab_size,), float("-inf"), device=device)
        if output_ids is None:
            allowed[:num_byte_tokens] = 0.0
        else:
            allowed[torch.tensor(output_ids, dtype=torch.long, device=device)] = 0.0
        self._bias_no_eos = allowed.clone()  # [V]: 0 where a token may be drawn, else -inf
        allowed[eos_id] = 0.0
        self._bias_eos = allowed
        self._rng = torch.Generator().manual_seed(seed)  # seeds for requests without one

    def sample(self, logits: Tensor, seqs: list[Sequence]) -> list[int]:
        """One token id per row of ``logits`` [N, V] (fp32), row i belonging to ``seqs[i]``."""
        ignore = [s.params.ignore_eos for s in seqs]
        if all(ignore):
            logits = logits + self._bias_no_eos
        elif not any(ignore):
            logits = logits + self._bias_eos
        else:
            flags = torch.tensor(ignore, device=logits.device)[:, None]
            logits = logits + torch.where(flags, self._bias_no_eos, self._bias_eos)
        greedy = logits.argmax(dim=-1).tolist()
        hot = [i for i, s in enumerate(seqs) if s.params.temperature > 0]
        if not hot:
            return greedy
        rows = logits[hot].cpu()  # [n_hot, V]: small, and CPU generators are device-independent
        for j, i in enumerate(hot):
            greedy[i] = self._draw(rows[j], seqs[i])
        return greedy

    def _draw(self, logits: Tensor, seq: Sequence) -> int:
        # logits: [V] fp32 on CPU
        p = seq.params
        seed = p.seed
        if seed is None:
            seed = int(torch.randint(0, 1 << 62, (1,), generator=self._rng))
        gen = torch.Generator().manual_seed(position_seed(seed, seq.num_tokens))
        probs = torch.softmax(logits / p.temperature, dim=-1)
        if p.top_p < 1.0:
            # Holtzman et al. 2020 (nucleus sampling): the smallest set of most likely tokens
            # whose mass reaches top_p; the first token is always kept.
            sorted_probs, order = probs.sort(descending=True)
            # The first is kept explicitly: a top_p below fp32's smallest value (1e-300)
            # compares as 0, which would keep nothing and make multinomial raise.
            keep = (sorted_probs.cumsum(0) - sorted_probs) < p.top_p
            keep[0] = True
            sorted_probs = sorted_probs * keep
            return int(order[torch.multinomial(sorted_probs, 1, generator=gen)])
        return int(torch.multinomial(probs, 1, generator=gen))
