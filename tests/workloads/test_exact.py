"""Prompts fitted to exactly N tokens as the server counts them."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadlab.config import EndpointConfig, RunConfig
from loadlab.workloads import build_requests
from loadlab.workloads._exact import fit_prompt, tokenizer_sizing


def test_fit_finds_the_prefix_with_the_count():
    fit = fit_prompt("abcdefghij" * 10, 7, lambda t: len(t) + 2)
    assert (fit.text, fit.counted) == ("abcde", 7)


def test_fit_when_a_merge_jumps_over_n_adds_one_character():
    # every 4 characters count 2 tokens, so an odd target is reached only with a tail "."
    fit = fit_prompt("abcd" * 50, 9, lambda t: 2 * (len(t.rstrip(".")) // 4) + t.count("."))
    assert fit.counted == 9 and fit.text.endswith(".")


def test_fit_when_a_cut_jumps_from_n_minus_2_to_n_plus_1_adds_punctuation():
    # every 5 characters count 3 tokens (a word and two spaces, as "an.  could" did with a real
    # vocabulary): 2 short of an odd multiple, one more character 1 over; marks count 1 each
    def count(t: str) -> int:
        bare = t.rstrip(".,!?;:")
        return 3 * (len(bare) // 5) + len(t) - len(bare)

    fit = fit_prompt("abcde" * 40, 11, count)
    assert fit.counted == 11 and fit.text.endswith(("..", ".,", ",.", ".!", ".?", ".;", ".:"))


def test_fit_below_the_template_overhead_gives_the_shortest():
    fit = fit_prompt("abcdef", 3, lambda t: len(t) + 10)
    assert fit.text == "a" and fit.counted == 11


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("tokenizers")
    from tests.helpers.bpe import make_tokenizer_dir

    return make_tokenizer_dir(tmp_path_factory.mktemp("bpe") / "tiny")


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("kind", ["synthetic", "chat"])
def test_every_prompt_counts_exactly_as_requested(tok_dir, api, kind):
    from loadlab.workloads._tokenizers import load_tokenizer

    tok = load_tokenizer(str(tok_dir))
    workload = {"kind": kind, "prompt_tokens": {"dist": "uniform", "low": 40, "high": 1900}}
    if kind == "chat":
        workload.update(sessions=6, turns=2, output_tokens=8)
    cfg = RunConfig(concurrency=2, requests=40, max_tokens=8, workload=workload,
                    endpoints=(EndpointConfig("http://127.0.0.1:1", api=api),))  # fmt: skip
    stream = build_requests(cfg, tokenizer_sizing(str(tok_dir), api))
    specs = list(stream)
    first = [s for s in specs if s.turn == 0]
    assert first and all(tok.count_prompt(s.prompt, api) == s.prompt_tokens for s in first)
    later = [s for s in specs if s.turn > 0]  # their own text is exact; history comes at send
    assert all(len(tok.encode(s.prompt)) == s.prompt_tokens for s in later)
    assert len({s.prompt[:12] for s in first}) == len(first)  # the request tags stay first
    fit = stream.extra()["prompt_fit"]  # type: ignore[attr-defined]
    assert fit["fitted"] == len(specs) and fit["exact"] == len(specs)


def test_same_seed_same_prompts(tok_dir):
    cfg = RunConfig(concurrency=1, requests=5, prompt_tokens=300, max_tokens=4, seed=7)
    how = tokenizer_sizing(str(tok_dir), "chat")
    assert [s.prompt for s in build_requests(cfg, how)] == [
        s.prompt for s in build_requests(cfg, how)
    ]


def test_auto_never_stops_a_run_and_says_so_once() -> None:
    from loadlab._runner.prompt_sizing import FALLBACK_CHARS_PER_TOKEN, ask_endpoint, size_prompts
    from tests.conftest import free_port

    dead = EndpointConfig(f"http://127.0.0.1:{free_port()}", name="gone")
    cfg = RunConfig(concurrency=1, requests=3, prompt_tokens=100, max_tokens=4, endpoints=(dead,),
                    tokenizer="auto")  # fmt: skip
    how = ask_endpoint(dead, "auto")
    assert how.fitter is None and how.chars_per_token == FALLBACK_CHARS_PER_TOKEN
    assert how.warning is not None and "endpoint gone" in how.warning
    with pytest.raises(ValueError, match="calibration"):
        ask_endpoint(
            dead, "calibrate"
        )  # asked for by name, a method that cannot work stops the run
    sized = size_prompts(cfg, dead)
    assert sized is not None and sized.warning == how.warning
    stream = build_requests(cfg, sized)
    specs = list(stream)
    # cut by the estimate: 100 tokens at 4 characters each
    assert [len(s.prompt) for s in specs] == [400] * 3
    assert stream.extra()["prompt_fit"] == {"method": "estimate (4 chars/token)"}  # type: ignore[attr-defined]
