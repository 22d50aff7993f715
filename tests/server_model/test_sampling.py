"""Sampler: masking of special ids, greedy choice, top-p, per-position seeding."""

from __future__ import annotations

import math

import torch

from reference_server.sampling import Sampler, position_seed
from reference_server.sequence import SamplingParams, Sequence


def make(**params: object) -> Sequence:
    return Sequence("r", [1, 2, 3], SamplingParams(**params))  # type: ignore[arg-type]


def sampler() -> Sampler:
    return Sampler(eos_id=256, num_byte_tokens=256, vocab_size=320, seed=0)


def test_greedy_masks_padding_and_eos_unless_allowed() -> None:
    logits = torch.zeros(3, 320)
    logits[:, 300] = 9.0  # a padding id: never drawn
    logits[:, 256] = 5.0  # eos
    logits[:, 65] = 3.0
    seqs = [make(), make(ignore_eos=False), make()]
    assert sampler().sample(logits, seqs) == [65, 256, 65]


def test_top_p_keeps_the_nucleus_only() -> None:
    # probabilities 0.6 (id 5), 0.3 (id 9), 0.1 spread over the rest; top_p 0.5 keeps {5},
    # top_p 0.85 keeps {5, 9}.
    p = torch.full((320,), 0.1 / 254)
    p[5], p[9] = 0.6, 0.3
    p[256:] = 0.0
    logits = p.clamp_min(1e-30).log()[None, :]
    s = sampler()
    for seed in range(20):
        assert s.sample(logits, [make(temperature=1.0, top_p=0.5, seed=seed)]) == [5]
    drawn = {s.sample(logits, [make(temperature=1.0, top_p=0.85, seed=k)])[0] for k in range(40)}
    assert drawn == {5, 9}  # 40 draws: P(never 9) = 0.667^40 < 1e-7, and fixed seeds anyway


def test_same_seed_same_position_same_token() -> None:
    logits = torch.randn(1, 320, generator=torch.Generator().manual_seed(1))
    s = sampler()
    draws = [s.sample(logits, [make(temperature=2.0, seed=3)])[0] for _ in range(3)]
    assert len(set(draws)) == 1 and 0 <= draws[0] < 256
    seeds = {position_seed(3, pos) for pos in range(100)} | {position_seed(4, 0)}
    assert len(seeds) == 101 and all(0 <= x < 2**63 for x in seeds)


def test_temperature_flattens_the_distribution() -> None:
    # Two tokens, logits 0 and ln 3: at temperature 1 token 1 has probability 3/4; at a huge
    # temperature both are near 1/2. Count over 400 seeded draws (deterministic).
    logits = torch.full((1, 320), -math.inf)
    logits[0, 0], logits[0, 1] = 0.0, math.log(3.0)
    s = sampler()
    cold = sum(s.sample(logits, [make(temperature=1.0, seed=k)])[0] for k in range(400))
    hot = sum(s.sample(logits, [make(temperature=100.0, seed=k)])[0] for k in range(400))
    assert 260 < cold < 340  # expected 300, sd 8.7
    assert 160 < hot < 240  # expected ~201


def test_output_ids_limit_what_can_be_drawn() -> None:
    # the model runner restricts output to "\n" and printable ASCII: one token, one character
    s = Sampler(eos_id=256, num_byte_tokens=256, vocab_size=320, output_ids=[10, 65, 66])
    logits = torch.zeros(2, 320)
    logits[:, 200] = 9.0  # a byte outside the allowed set
    logits[:, 66] = 1.0
    assert s.sample(logits, [make(), make(temperature=1.0, seed=1)])[0] == 66
    drawn = {s.sample(logits, [make(temperature=5.0, seed=k)])[0] for k in range(30)}
    assert drawn <= {10, 65, 66}


def test_a_vanishing_top_p_keeps_the_most_likely_token() -> None:
    """top_p 1e-300 rounds to 0 in fp32, which would keep no token and make multinomial raise
    (the whole batch then rerun one request at a time). The nucleus always holds its first."""
    logits = torch.randn(2, 320, generator=torch.Generator().manual_seed(2))
    s = sampler()
    seqs = [make(temperature=2.0, top_p=1e-300, seed=1), make(temperature=2.0, top_p=1e-300)]
    best = int(logits[0, :256].argmax()), int(logits[1, :256].argmax())
    assert tuple(s.sample(logits, seqs)) == best
