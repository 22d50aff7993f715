"""The image encoder really runs: an image's pixels, not its placeholder ids, decide its K/V
and the next token; its vectors go through the same layers and paged KV cache as text (a
dense reference and a chunked prefill that splits the image agree); its weights are seeded
with the model's and leave the language model's weights as they were."""

from __future__ import annotations

import math
import random

import pytest
import torch

from reference_server.model import PatchEmbed, Transformer, init_weights
from reference_server.model_runner import ModelRunner
from reference_server.sequence import ScheduledBatch, ScheduledSeq, Sequence
from reference_server.vision import PATCH, Image
from tests.helpers.model_driver import Driver, assert_close, dense_forward, prompt_of, seq

ATOL = 2e-4  # fp32; paged and dense differ only in summation order
W, H = 56, 84  # 2 x 3 tiles: 6 image tokens
BEFORE, AFTER = 5, 7  # text tokens around the image


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner("tiny", num_kv_blocks=256, block_size=4, device="cpu", seed=0)


def image(salt: int, w: int = W, h: int = H) -> Image:
    rng = random.Random(salt)
    n = math.ceil(w / PATCH) * math.ceil(h / PATCH)
    rgb = bytes(rng.randrange(256) for _ in range(w * h * 3))
    return Image(b"key", w, h, rgb, "!" * n)  # the same placeholder ids whatever the pixels


def image_seq(seq_id: str, img: Image | None) -> Sequence:
    """Text, 6 placeholder ids, text; the placeholders carry ``img`` (None: no image)."""
    ids = prompt_of(BEFORE, 1) + [ord("!")] * 6 + prompt_of(AFTER, 2)
    s = seq(seq_id, ids)
    s.images = [(BEFORE, img)] if img is not None else []
    return s


def prefill(runner: ModelRunner, s: Sequence, chunks: list[int]) -> None:
    drv = Driver(runner, shuffle_seed=len(chunks))
    for n in chunks:
        drv.step([(s, n)])


def prefill_logits(runner: ModelRunner, s: Sequence) -> torch.Tensor:
    """The next token's logits [V] after a whole-prompt prefill; the K/V stay in the cache."""
    s.block_table = Driver(runner).free[: -(-s.num_prompt_tokens // runner.block_size)]
    _, logits = runner.logits(ScheduledBatch([ScheduledSeq(s, s.num_prompt_tokens)]))
    s.num_computed_tokens = s.num_prompt_tokens
    return logits[0]


def test_different_pixels_under_the_same_ids_give_different_kv_and_logits(
    runner: ModelRunner,
) -> None:
    a, b, text = image_seq("a", image(1)), image_seq("b", image(2)), image_seq("t", None)
    la = prefill_logits(runner, a)
    kva = runner.export_kv(a)
    lb = prefill_logits(runner, b)
    kvb = runner.export_kv(b)
    lt = prefill_logits(runner, text)
    assert_close(kva[:, :, :BEFORE], kvb[:, :, :BEFORE], 0.0)  # the text before: untouched
    diff = (kva[:, :, BEFORE:] - kvb[:, :, BEFORE:]).abs().flatten(3).amax(dim=-1)
    assert bool((diff[0, :, :6] > 0).all())  # layer 0's K/V are the image tokens' own inputs
    assert bool((diff[1:] > 0).all())  # later layers: every token from the image on attended
    assert float((la - lb).abs().max()) > 1e-3  # the pixels reach the next token's logits
    assert float((la - lt).abs().max()) > 1e-3  # and the placeholder ids' embeddings do not


def test_image_prefill_matches_a_dense_reference_fed_the_encoder(runner: ModelRunner) -> None:
    img = image(3)
    s = image_seq("d", img)
    logits = prefill_logits(runner, s)
    rgb = torch.frombuffer(bytearray(img.rgb), dtype=torch.uint8).view(H, W, 3)
    rows = torch.arange(BEFORE, BEFORE + 6)
    embeds = (rows, runner.image_encoder(runner.image_encoder.tiles(rgb)))
    ref_logits, ref_kv = dense_forward(runner, s.prompt_token_ids, embeds)
    assert_close(runner.export_kv(s), ref_kv, ATOL)
    assert_close(logits, ref_logits[-1], ATOL)


def test_a_chunked_prefill_that_splits_the_image_matches_the_whole(runner: ModelRunner) -> None:
    whole, split = image_seq("w", image(4)), image_seq("c", image(4))
    prefill(runner, whole, [whole.num_prompt_tokens])
    prefill(runner, split, [BEFORE + 2, 3, whole.num_prompt_tokens - BEFORE - 5])  # 2 | 3 | 1
    assert_close(runner.export_kv(split), runner.export_kv(whole), ATOL)
    assert split.output_token_ids == whole.output_token_ids


def test_tiles_are_row_major_channel_first_and_padded_black() -> None:
    enc = PatchEmbed(dim=8, patch=PATCH)
    rgb = torch.randint(0, 256, (29, 30, 3), dtype=torch.uint8)  # 2 x 2 tiles, 3 of them partial
    tiles = enc.tiles(rgb)
    assert tiles.shape == (4, 3 * PATCH * PATCH)
    want = (rgb[:PATCH, PATCH:].float() / 127.5 - 1).permute(2, 0, 1)  # tile 1: top right
    got = tiles[1].view(3, PATCH, PATCH)
    assert_close(got[:, :, :2], want, 1e-6)
    assert bool((got[:, :, 2:] == -1).all())  # the 26 columns past the image are black


def test_encoder_weights_are_seeded_after_the_model_s() -> None:
    a, b = (
        ModelRunner("tiny", num_kv_blocks=4, seed=0),
        ModelRunner("tiny", num_kv_blocks=4, seed=0),
    )
    c = ModelRunner("tiny", num_kv_blocks=4, seed=1)
    wa, wb, wc = (r.image_encoder.proj.weight for r in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    plain = Transformer(a.args)
    init_weights(plain, seed=0)  # no encoder: the language model's weights are the same
    for (name, p), q in zip(plain.named_parameters(), a.model.parameters(), strict=True):
        assert torch.equal(p, q), name
