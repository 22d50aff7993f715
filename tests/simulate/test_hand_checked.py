"""Hand-checked cases: each expected time is worked out from the step-time formula."""

from __future__ import annotations

import itertools

import pytest

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.simulate import LinearStepTime, ServerConfig, Simulator

# 10 ms per step, + 0.1 ms per token, + 1 ms per sequence in the batch: easy to add by hand
MODEL = LinearStepTime(base_s=0.010, per_prefill_token_s=0.0001, per_decode_token_s=0.0011)


def step_ms(prefill: int, decode: int) -> float:
    """10 ms a step, + 0.1 ms per prompt token, + 1.1 ms per decode row."""
    return 10.0 + 0.1 * prefill + 1.1 * decode


def spec(rid: str, prompt: int, out: int, at: float = 0.0) -> RequestSpec:
    # a prompt unlike the others (as the workloads' request tags make them): no cache hits
    return RequestSpec(
        rid, (rid + "x" * prompt)[:prompt], out, intended_at_s=at, prompt_tokens=prompt
    )


def run(server: ServerConfig, specs: list[RequestSpec], *, fast: bool = True):  # type: ignore[no-untyped-def]
    cfg = RunConfig(rate_rps=1.0, requests=len(specs))
    return Simulator(cfg, server, MODEL, fast=fast).run(specs)


def chunk_ms(out, i: int) -> list[float]:  # type: ignore[no-untyped-def]
    rec = out.to_results().records[i]
    return [(t - rec.sent_ns) / 1e6 for t in rec.chunk_ns]


@pytest.mark.parametrize("mode", ["static", "continuous", "chunked"])
@pytest.mark.parametrize("fast", [True, False])
def test_one_request_alone(mode: str, fast: bool) -> None:
    """TTFT is its prefill step (the step that prefills the prompt samples the first token);
    every later token is one decode step of a batch of one, at its growing context."""
    out = run(ServerConfig(mode=mode), [spec("a", 100, 5)], fast=fast)
    t = chunk_ms(out, 0)
    prefill = step_ms(100, 0)  # 10 + 10 = 20 ms
    decode = step_ms(0, 1)  # 11.1 ms
    assert t[0] == pytest.approx(prefill)
    assert t == pytest.approx([prefill + k * decode for k in range(5)])
    assert out.num_steps == 5


@pytest.mark.parametrize("fast", [True, False])
def test_static_batch_shorter_slot_idles(fast: bool) -> None:
    """Two requests in one static batch, 10 and 20 output tokens: the batch runs 20 steps;
    the shorter one's row runs as padding for the last 10 (pad) or its slot stays empty
    (idle); a third request waits for the whole batch."""
    for finished, rows_late in (("pad", 2), ("idle", 1)):
        server = ServerConfig(mode="static", static_finished=finished)
        out = run(
            server, [spec("a", 50, 10), spec("b", 50, 20), spec("c", 50, 1, at=0.001)], fast=fast
        )
        a, b, c = (chunk_ms(out, i) for i in range(3))
        steps = out.step_end_s - out.step_start_s
        first = step_ms(100, 0)
        assert steps[0] * 1e3 == pytest.approx(first)
        assert list(steps[1:10] * 1e3) == pytest.approx([step_ms(0, 2)] * 9)
        # the 10 steps after the shorter one ended: one live row, plus its padding row
        assert list(steps[10:20] * 1e3) == pytest.approx([step_ms(0, rows_late)] * 10)
        assert len(a) == 10 and len(b) == 20
        assert a[-1] == pytest.approx(first + 9 * step_ms(0, 2))
        assert b[-1] == pytest.approx(first + 9 * step_ms(0, 2) + 10 * step_ms(0, rows_late))
        # c arrived 1 ms in, and starts when the 20-step batch is over
        assert c[0] + 1.0 == pytest.approx(b[-1] + step_ms(50, 0))


@pytest.mark.parametrize(
    ("chunk", "budget", "slices"),
    [
        (256, 512, [256, 256, 256, 232]),
        (512, 512, [512, 488]),
        (1000, 2048, [1000]),
        (300, 512, [300, 300, 300, 100]),
    ],
)
@pytest.mark.parametrize("fast", [True, False])
def test_chunked_budget_splits_a_long_prompt(
    chunk: int, budget: int, slices: list[int], fast: bool
) -> None:
    """A 1,000-token prompt under a chunk size and budget: ceil(1000 / chunk) steps, the last
    slice what is left; the first token comes at the end of the last slice."""
    server = ServerConfig(mode="chunked", chunk_size=chunk, max_num_batched_tokens=budget)
    out = run(server, [spec("a", 1000, 3)], fast=fast)
    steps_ms = list((out.step_end_s - out.step_start_s) * 1e3)
    assert out.num_steps == len(slices) + 2
    assert steps_ms[: len(slices)] == pytest.approx([step_ms(n, 0) for n in slices])
    assert chunk_ms(out, 0)[0] == pytest.approx(sum(step_ms(n, 0) for n in slices))


def test_chunked_slices_share_the_budget_with_decodes() -> None:
    """A running decode takes 1 token of the 512 budget: the newcomer's slice is 511 when
    chunk_size allows it."""
    server = ServerConfig(mode="chunked", chunk_size=1024, max_num_batched_tokens=512)
    out = run(server, [spec("a", 10, 50), spec("b", 1000, 2, at=0.0001)])
    steps = out.step_end_s - out.step_start_s
    # step 0: a's prompt (10); step 1: a's decode + b's first 511; step 2: a + b's 489
    assert steps[1] * 1e3 == pytest.approx(step_ms(511, 1))
    assert steps[2] * 1e3 == pytest.approx(step_ms(489, 1))


def test_continuous_newcomer_joins_the_running_batch() -> None:
    """Continuous: a request arriving mid-stream has its whole prompt prefilled in the same
    forward pass as the running decode (a long step for the running stream: the stall)."""
    server = ServerConfig(mode="continuous")
    out = run(server, [spec("a", 10, 20), spec("b", 400, 2, at=0.015)])
    a = chunk_ms(out, 0)
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert max(gaps) == pytest.approx(step_ms(400, 1))
