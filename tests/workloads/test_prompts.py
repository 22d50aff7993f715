"""Exact prompt lengths, Mooncake shared prefixes, chars-per-token calibration."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass

import numpy as np
import pytest

from loadlab.records import RequestRecord
from loadlab.workloads._prompts import (
    BLOCK_TOKENS,
    CORPUS_CHARS,
    CalibrationError,
    block_text,
    calibrate_chars_per_token,
    chars_per_token_from_tokenizer,
    prefix_prompt,
    prompt_text,
)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 512, 4142, 14050, CORPUS_CHARS + 1234])
def test_prompt_is_exactly_n_ascii_chars(n):
    text = prompt_text(n, np.random.default_rng(n), tag="req-1")
    assert len(text) == n
    assert text.isascii()
    assert len(text.encode()) == n  # the byte tokenizer counts bytes
    assert text == text.strip()  # no edge whitespace a server might strip


def test_prompt_text_is_varied_words_and_seeded():
    a = prompt_text(2000, np.random.default_rng(1), tag="r1")
    assert a.startswith("r1 ")
    assert len(set(a)) > 15 and len(set(a.split())) > 50
    assert a == prompt_text(2000, np.random.default_rng(1), tag="r1")
    assert a != prompt_text(2000, np.random.default_rng(2), tag="r1")


def test_distinct_tags_never_share_a_prefix():
    rng = np.random.default_rng(0)
    a, b = prompt_text(300, rng, tag="trace-2"), prompt_text(300, rng, tag="trace-3")
    assert a[:6] == b[:6] and a[6] != b[6]  # differ right after the common "trace-"


def test_chars_per_token_scales_the_length():
    assert len(prompt_text(100, np.random.default_rng(0), chars_per_token=4.2)) == 420


def test_equal_hash_ids_give_identical_prefixes():
    a = prefix_prompt([0, 1, 2, 3], 1800, tag="a")
    b = prefix_prompt([0, 1, 2, 9], 2000, tag="b")
    assert len(a) == 1800 and len(b) == 2000
    assert a[: 3 * BLOCK_TOKENS] == b[: 3 * BLOCK_TOKENS]
    # block 3 vs block 9: "<3> ..." vs "<9> ...": they differ right after the "<"
    assert a[3 * BLOCK_TOKENS + 1] != b[3 * BLOCK_TOKENS + 1]
    assert a[3 * BLOCK_TOKENS :] == block_text(3)[: 1800 - 3 * BLOCK_TOKENS]  # truncated last


def test_different_ids_differ_from_their_first_characters():
    assert prefix_prompt([5], 100)[0:3] == "<5>"
    assert prefix_prompt([5], 512) != prefix_prompt([6], 512)
    assert all(block_text(i) != block_text(j) for i in range(50) for j in range(i))


def test_ids_short_of_the_length_are_padded_with_unique_text():
    a = prefix_prompt([1], 700, rng=np.random.default_rng(0), tag="x1")
    assert len(a) == 700 and a[:512] == block_text(1) and a[512:515] == "x1 "


def test_mooncake_rows_sharing_ids_share_exactly_that_prefix(shared_data):
    rows = []
    with (shared_data / "traces" / "mooncake_conversation_trace.jsonl").open() as f:
        for _, line in zip(range(200), f, strict=False):
            rows.append(json.loads(line))
    prompts = [prefix_prompt(r["hash_ids"], r["input_length"]) for r in rows]
    checked = 0
    for i, r in enumerate(rows):
        assert len(r["hash_ids"]) == math.ceil(r["input_length"] / BLOCK_TOKENS)
        assert len(prompts[i]) == r["input_length"]
        for j, s in enumerate(rows[:i]):
            common = 0
            while (
                common < min(len(r["hash_ids"]), len(s["hash_ids"]))
                and r["hash_ids"][common] == s["hash_ids"][common]
            ):
                common += 1
            if common == 0:
                continue
            pr, ps = prompts[i], prompts[j]
            if common < min(len(r["hash_ids"]), len(s["hash_ids"])):
                at = common * BLOCK_TOKENS + 1  # the first differing block's id digit
                assert pr[at] != ps[at] or pr[at : at + 12] != ps[at : at + 12]
            n = min(common * BLOCK_TOKENS, len(pr), len(ps))
            assert pr[:n] == ps[:n]
            checked += 1
    assert checked > 100  # the trace's first rows share the system prompt block 0


@dataclass
class _Done:
    record: RequestRecord
    text: str = ""


class _CountingClient:
    """A stand-in for the Client protocol whose 'server' counts ceil(chars / 4) + 7 prompt
    tokens (a template overhead of 7): the calibration must recover 4 chars per token."""

    def __init__(self, report_usage: bool = True):
        self.report_usage = report_usage

    async def send(self, spec, *, t0_ns, history=(), intended_ns=None):
        tokens = math.ceil(len(spec.prompt) / 4) + 7 if self.report_usage else None
        return _Done(RequestRecord(spec.request_id, prompt_tokens=tokens))


def test_calibration_cancels_the_template_overhead():
    cpt = asyncio.run(calibrate_chars_per_token(_CountingClient()))
    assert cpt == pytest.approx(4.0, rel=0.01)


def test_calibration_without_usage_says_what_to_do():
    with pytest.raises(CalibrationError, match="chars_per_token"):
        asyncio.run(calibrate_chars_per_token(_CountingClient(report_usage=False)))


def test_tokenizer_file_needs_the_optional_package(tmp_path):
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="pip install tokenizers"):
            chars_per_token_from_tokenizer(str(tmp_path / "tokenizer.json"))
        return
    pytest.skip("tokenizers is installed; the byte-level check below covers it")
