"""The sizing sequence: the seed's example exactly, and both regimes of the memory cross-check."""

from __future__ import annotations

import pytest

from loadlab._capacity.hardware import get_hardware
from loadlab._capacity.models import get_model
from loadlab._capacity.sizing import MemoryCheck, Plan, size_first_principles, size_from_figures
from loadlab.cli import main


def test_seed_example_exact() -> None:
    # 2,000 / 250 = 8 completions per GPU per second; 400 / 8 = 50; 50 x 1.3 = 65
    plan = size_from_figures(2000, 250, 400, headroom=0.3)
    values = [s.value for s in plan.steps]
    assert values[:6] == [2000, 250, 8, 400, 50, 65]
    assert plan.decode_gpus == 50
    assert plan.total_gpus == 65  # not 66: 50 * 1.3 = 65.00000000000001 in floating point
    assert plan.binding == "throughput"


def _llama_8b_on_h100(*, prompt_tokens: int, output_tokens: int, rate_rps: float) -> Plan:
    """The seed's figures (2,000 tokens/s per GPU, 30% headroom) with the memory cross-check
    for Llama-3-8B on an H100."""
    check = MemoryCheck(get_model("llama-3-8b"), get_hardware("h100"), prompt_tokens=prompt_tokens)
    return size_from_figures(2000, output_tokens, rate_rps, 0.3, memory=check)


def test_short_requests_at_high_rate_are_throughput_bound() -> None:
    # Llama-3-8B on H100, 200-token prompts: KV 450 tokens * 131,072 = 58,982,400 B per
    # request; 55,939,477,504 B free (80e9 * 0.9 - 16,060,522,496 weights) -> 948 per GPU.
    # Each stream decodes at 64 / 2,000 = 32 ms per token: W = 250 * 0.032 + ~0.006 s prefill
    # = 8.006 s; Little: 400 * 8.006 = 3,202 in flight -> ceil(3,202 / 948) = 4 GPUs,
    # x 1.3 = 5.2 -> 6. The throughput bound (65) is larger: memory does not change it.
    plan = _llama_8b_on_h100(prompt_tokens=200, output_tokens=250, rate_rps=400)
    assert (plan.throughput_gpus, plan.memory_gpus, plan.total_gpus) == (65, 6, 65)
    assert plan.binding == "throughput"


def test_long_conversations_at_low_rate_are_memory_bound() -> None:
    # Same figures but 100,000-token conversations at 0.5 requests/s, 500-token answers.
    # Throughput: 2,000 / 500 = 4 per GPU per s; 0.5 / 4 = 0.125 -> 1 GPU, x 1.3 -> 2.
    # Memory: 100,500 tokens * 131,072 = 13,172,736,000 B per request; 55,939,477,504 / that
    # = 4.25 -> 4 requests per GPU. W = prefill + 500 * 0.032 s; prefill = (2 * 7,504,924,672
    # * 1e5 + 4 * 32 * 4096 * 1e5 * 100,001 / 2) FLOPs / (989.4e12 * 0.6) = 6.94 s, so
    # W = 22.94 s; Little: 0.5 * 22.94 = 11.5 in flight -> ceil(11.5 / 4) = 3 GPUs, x 1.3 -> 4.
    plan = _llama_8b_on_h100(prompt_tokens=100_000, output_tokens=500, rate_rps=0.5)
    assert (plan.throughput_gpus, plan.memory_gpus) == (2, 4)
    assert plan.total_gpus == 4  # the cross-check changed the answer
    assert plan.binding == "memory"
    mean_s = next(s.value for s in plan.steps if s.label == "mean request time")
    assert mean_s == pytest.approx(22.944, abs=1e-3)


def test_first_principles_both_regimes() -> None:
    m, h100 = get_model("llama-3-8b"), get_hardware("h100")
    short = size_first_principles(MemoryCheck(m, h100, 500), 200, peak_rps=100)
    assert short.binding == "throughput"
    long = size_first_principles(MemoryCheck(m, h100, 60_000), 400, peak_rps=0.2)
    assert long.binding == "memory"
    assert long.memory_gpus is not None and long.memory_gpus > long.throughput_gpus


def test_bad_figures_are_rejected_with_the_flag_name() -> None:
    with pytest.raises(ValueError, match="--peak-rps"):
        size_from_figures(2000, 250, 0)
    with pytest.raises(ValueError, match="--headroom"):
        size_from_figures(2000, 250, 400, headroom=-0.1)


def test_cli_prints_every_step(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["capacity", "--decode-tokens-per-s", "2000", "--completion-tokens", "250",
            "--peak-rps", "400", "--headroom", "0.3"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2,000 / 250 = 8" in out
    assert "400 / 8 = 50" in out
    assert "50 x 1.3 = 65 GPUs" in out
    assert "=> 65 GPUs (throughput binds" in out


def test_cli_memory_cross_check(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["capacity", "--decode-tokens-per-s", "2000", "--completion-tokens", "500",
            "--peak-rps", "0.5", "--model", "llama-3-8b", "--hardware", "h100",
            "--prompt-tokens", "100000"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 x 32 x 8 x 128 x 2 = 131,072 bytes" in out
    assert "=> 4 GPUs (memory binds" in out


def test_cli_first_principles_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--model", "llama-3-8b", "--hardware", "h200"]) == 0
    out = capsys.readouterr().out
    assert "KV cache 131,072 bytes/token" in out
    assert main(["capacity", "--model", "llama-3-8b"]) == 2
    assert "--hardware is needed" in capsys.readouterr().err
    assert main(["capacity", "--model", "llama-3-8b", "--hardware", "tpu9"]) == 2


def test_a_prefix_hit_rate_shares_blocks_once_and_prices_the_uncached_prefill() -> None:
    # Llama-3-8B on H100, 2,000-token prompts, 250-token answers. Half cached: 1,000 tokens
    # shared, counted once (131,072,000 B); each request holds 1,250 tokens (163,840,000 B):
    # (55,939,477,504 - 131,072,000) / 163,840,000 = 340.6 -> 340 in flight per GPU, against
    # 55,939,477,504 / (2,250 x 131,072) = 189.7 -> 189 without caching.
    m, hw = get_model("llama-3-8b"), get_hardware("h100")
    steps = {}
    for rate in (0.0, 0.5):
        check = MemoryCheck(m, hw, prompt_tokens=2000, prefix_hit_rate=rate)
        plan = size_from_figures(2000, 250, 40, 0.3, memory=check)
        steps[rate] = {s.label: s.value for s in plan.steps}
    assert steps[0.0]["max requests in flight per GPU"] == 189
    assert steps[0.5]["max requests in flight per GPU"] == 340
    assert steps[0.5]["shared prefix KV, counted once"] == pytest.approx(0.131072)
    first = size_first_principles(MemoryCheck(m, hw, 2000, prefix_hit_rate=0.9), 250, 40)
    label = "GPUs for prefill (2,000-token prompts, 1,800 cached: 200 computed)"
    assert label in {s.label for s in first.steps}
    with pytest.raises(ValueError, match="fraction in"):
        MemoryCheck(m, hw, 2000, prefix_hit_rate=1.0)


def test_a_prefix_hit_rate_that_could_change_nothing_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """From figures alone the hit rate has nothing to act on (prefill is in --headroom): it is
    exit 2 naming what it needs, not a silent no-op; with the model it changes the estimate;
    its help shows no "(0.5)" that reads as a default."""
    figures = ["capacity", "--decode-tokens-per-s", "2000", "--completion-tokens", "250",
               "--peak-rps", "400", "--headroom", "0.3"]  # fmt: skip
    assert main([*figures, "--prefix-hit-rate", "0.5"]) == 2
    assert "changes the estimate only with --model, --hardware and --prompt-tokens" in (
        capsys.readouterr().err
    )
    model = ["--model", "llama-3-8b", "--hardware", "h100", "--prompt-tokens", "4000"]
    assert main([*figures, *model]) == 0
    plain = capsys.readouterr().out.splitlines()[-1]
    assert main([*figures, *model, "--prefix-hit-rate", "0.5"]) == 0
    cached = capsys.readouterr().out.splitlines()[-1]
    assert plain != cached and "memory bound" in cached
    with pytest.raises(SystemExit):
        main(["capacity", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--prefix-hit-rate H" in text and "(0.5)" not in text and "(default: none)" in text
