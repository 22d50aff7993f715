"""Self-monitoring, --workers N, the progress line and the run command's flag mapping."""

from __future__ import annotations

import argparse
import asyncio
import io
import time
from pathlib import Path
from typing import Any

import pytest

from loadlab._analysis.generator import (
    merge_parts,
    saturation_warning,
    stalled_first_tokens,
    stalled_later_tokens,
)
from loadlab._analysis.metrics import count_outcomes
from loadlab._commands import run as run_cmd
from loadlab._runner.fanout import partition, run_processes, share
from loadlab._runner.monitor import LoopMonitor
from loadlab._runner.outputs import out_paths
from loadlab._runner.progress import Progress, format_line
from loadlab._runner.prompt_sizing import size_prompts
from loadlab._runner.runner import LiveStats
from loadlab.clients import _pool as pool
from loadlab.config import DEMO, EndpointConfig, RunConfig
from loadlab.errors import ConfigError
from loadlab.records import RequestSpec
from loadlab.workloads import build_requests
from tests.helpers.fakes import FakeClient


def test_monitor_flags_a_blocked_loop() -> None:
    async def go(block_s: float) -> dict[str, object]:
        mon = LoopMonitor(threshold_ms=20.0, sample_s=0.05)
        mon.start(time.perf_counter_ns())
        for _ in range(8):
            await asyncio.sleep(0.02)
            time.sleep(block_s)  # the generator doing too much work between awaits
        return await mon.stop()

    busy = asyncio.run(go(0.06))
    assert busy["saturated"] is True and busy["loop_lag_ms_max"] >= 40.0
    assert busy["samples"] and "SATURATED" in (saturation_warning(busy) or "")
    assert saturation_warning({"saturated": False}) is None


def test_monitor_counts_first_tokens_read_after_a_stall() -> None:
    """One 40 ms stall in 1.5 s of calm: one late tick in 150 leaves the ticker's p99 low, but
    first tokens stamped as the loop came back are counted, and past 1 % of the first tokens
    the run is saturated (their TTFT may be 40 ms late); one in 100 is reported, not flagged."""

    async def go() -> tuple[LoopMonitor, dict[str, Any], int, int]:
        mon = LoopMonitor(threshold_ms=20.0, sample_s=0.05)
        t0 = time.perf_counter_ns()
        mon.start(t0)
        await asyncio.sleep(1.5)
        time.sleep(0.04)  # the loop away: work between awaits, or no CPU for the process
        back = time.perf_counter_ns() - t0  # a read stamped as the loop comes back
        await asyncio.sleep(0.1)
        calm = time.perf_counter_ns() - t0
        return mon, await mon.stop(), back, calm

    mon, section, back, calm = asyncio.run(go())
    assert section["saturated"] is False and section["loop_lag_ms_p99"] < 20.0
    away = mon.stalled_stamps([back, calm])
    assert away[0] >= 30.0 and away[1] == 0.0
    one = dict(section)
    mon.judge_tokens(one, [[back]] + [[calm]] * 99)
    assert one["saturated"] is False and one["stalled_first_tokens"] == 1
    assert stalled_first_tokens(one) is None and saturation_warning(one) is None
    two = dict(section)
    mon.judge_tokens(two, [[back]] * 2 + [[calm]] * 98)
    assert two["saturated"] is True and two["first_tokens"] == 100
    assert two["stalled_first_token_ms_max"] >= 30.0
    assert stalled_first_tokens(two) == (2, 100, two["stalled_first_token_ms_max"])
    assert "2 of 100 first tokens" in (saturation_warning(two) or "")
    # the tokens after the first, the same way: 3 of 200 read as the loop came back
    later = dict(section)
    mon.judge_tokens(later, [[calm, back, calm]] * 3 + [[calm, calm, calm]] * 97)
    assert later["later_tokens_checked"] == 200 and later["stalled_later_tokens"] == 3
    assert later["saturated"] is True and stalled_later_tokens(later) == (3, 200)
    assert "3 of 200 tokens after the first" in (saturation_warning(later) or "")
    # a --workers run: the processes' counts add up
    assert stalled_first_tokens(merge_parts([one, one])) is None
    assert stalled_first_tokens(merge_parts([one, two]))[:2] == (3, 200)  # type: ignore[index]


def test_monitor_flags_a_parse_backlog_that_does_not_drain() -> None:
    """Reads stamped but parsed 30 ms late, most of the time: saturated, though the loop's
    own ticks are on time; a backlog that clears in bursts is reported but not flagged."""

    async def go(ages_ms: list[float]) -> dict[str, object]:
        loop = asyncio.get_running_loop()
        deferred = pool._Deferred(loop)  # a pool's parse queue
        mon = LoopMonitor(threshold_ms=20.0, sample_s=0.05)
        mon.start(time.perf_counter_ns())
        for age in ages_ms:
            deferred.items[:] = (
                [(None, b"", time.perf_counter_ns() - int(age * 1e6))] if age else []
            )
            await asyncio.sleep(0.012)
        deferred.items.clear()
        return await mon.stop()

    behind = asyncio.run(go([30.0] * 12))
    assert behind["saturated"] is True and behind["parse_backlog_ms_p50"] >= 30.0
    assert "interpreted them late" in (saturation_warning(behind) or "")
    bursty = asyncio.run(go([0.0] * 9 + [45.0] * 3))
    assert bursty["parse_backlog_ms_max"] >= 45.0 and bursty["saturated"] is False


def test_share_and_partition_keep_sessions_whole() -> None:
    assert [share(5, 2, i) for i in (0, 1)] == [3, 2] and share(None, 2, 0) is None
    specs = [
        RequestSpec("a", "p", 1),
        RequestSpec("s0", "p", 1, session_id="s"),
        RequestSpec("s1", "p", 1, session_id="s", turn=1),
        RequestSpec("b", "p", 1),
    ]
    assert [s.request_id for s in partition(specs, 2, 0)] == ["a", "b"]
    assert [s.request_id for s in partition(specs, 2, 1)] == ["s0", "s1"]
    assert [s.request_id for s in partition(specs, 2, 0, requests=2)] == ["a"]


def _fake_factory(endpoint: EndpointConfig, cfg: RunConfig) -> FakeClient:
    return FakeClient(ttft_s=0.01)


def test_two_workers_merge_into_one_results() -> None:
    cfg = RunConfig(concurrency=4, requests=40, workers=2, progress=False, prompt_tokens=4)
    res = run_processes(
        cfg,
        EndpointConfig(url="http://127.0.0.1:1", name="x"),
        build_requests,
        client_factory=_fake_factory,
    )
    assert len(res.records) == 40 and res.workers == 2
    assert {r.worker for r in res.records} == {0, 1}
    assert sorted(r.request_id for r in res.records) == sorted(f"syn-{i:06d}" for i in range(40))
    assert count_outcomes(res.records).ok == 40 and res.scheduled_count == 40
    assert {r.endpoint for r in res.records} == {"x"}


def test_progress_line_and_quiet_without_tty() -> None:
    line = format_line(LiveStats(done=12, in_flight=3, failed=1), 4.0, 1234.0, 60.0, 100)
    assert line == "[   4.0s / 60s]  done 12/100  in flight 3  dropped 0  errors 1  out 1,234 tok/s"
    assert Progress(LiveStats(), stream=io.StringIO()).enabled is False
    # a gated open loop's 40 requests started ahead, 35 of them due and written: 5 not in flight
    waiting = LiveStats(in_flight=40, ahead=100, fired=95)
    assert "in flight 35 " in format_line(waiting, 1.0, 0.0)


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    run_cmd.add_arguments(p)
    return p.parse_args(list(argv))


def test_flags_map_to_run_config() -> None:
    cfg = run_cmd.config_from_args(
        _args(
            "--endpoint",
            "http://127.0.0.1:9/",
            "--model",
            "m",
            "--rate",
            "3",
            "--arrival",
            "gamma",
            "--cv",
            "2",
            "--duration",
            "10",
            "--prompt-tokens",
            "7",
            "--max-tokens",
            "9",
            "--extra-body",
            '{"ignore_eos": true}',
            "--header",
            "X-A: b",
            "--api-key-env",
            "K",
            "--max-in-flight",
            "5",
            "--warmup",
            "1",
            "--cooldown",
            "2",
            "--seed",
            "4",
            "--no-progress",
        )
    )
    assert (cfg.rate_rps, cfg.concurrency, cfg.arrival, cfg.cv, cfg.duration_s) == (
        3.0,
        None,
        "gamma",
        2.0,
        10.0,
    )
    assert (cfg.prompt_tokens, cfg.max_tokens, cfg.max_in_flight, cfg.seed) == (7, 9, 5, 4)
    assert (cfg.warmup_s, cfg.cooldown_s, cfg.progress) == (1.0, 2.0, False)
    assert cfg.extra_body == {"ignore_eos": True}
    (ep,) = cfg.endpoints
    assert (ep.name, ep.model, ep.api_key_env, dict(ep.headers)) == (
        "default",
        "m",
        "K",
        {"X-A": "b"},
    )


def test_named_endpoints_and_clear_errors() -> None:
    cfg = run_cmd.config_from_args(
        _args(
            "--endpoint",
            "a=http://127.0.0.1:1",
            "--endpoint",
            "b=http://127.0.0.1:2",
            "--concurrency",
            "2",
            "--requests",
            "3",
        )
    )
    assert [e.name for e in cfg.endpoints] == ["a", "b"]
    assert [p.name for p in out_paths(cfg.replace(out="r/x.json"), ["a", "b"])] == [
        "x-a.json",
        "x-b.json",
    ]
    with pytest.raises(ValueError, match="not both"):
        run_cmd.config_from_args(
            _args("--endpoint", "http://h:1", "--rate", "1", "--concurrency", "1")
        )
    with pytest.raises(ValueError, match="JSON"):
        run_cmd.config_from_args(
            _args(
                "--endpoint", "http://h:1", "--rate", "1", "--requests", "1", "--extra-body", "{bad"
            )
        )
    with pytest.raises(ConfigError, match="concurrency"):  # no load mode
        run_cmd.run(_args("--endpoint", "http://h:1", "--requests", "1"))


def test_demo_defaults_apply_only_without_endpoint() -> None:
    cfg = run_cmd.config_from_args(_args("--rate", "2", "--duration", "5"))
    assert (cfg.rate_rps, cfg.concurrency, cfg.duration_s, cfg.requests) == (2.0, None, 5.0, None)
    demo = run_cmd.config_from_args(_args())
    assert demo.concurrency == DEMO["concurrency"] and demo.endpoints == ()


def test_tokenizer_is_a_run_setting_and_exact_output_a_workload_key(tmp_path: Path) -> None:
    cfg = run_cmd.config_from_args(
        _args(
            "--endpoint",
            "http://h:1",
            "--concurrency",
            "1",
            "--requests",
            "2",
            "--tokenizer",
            "server",
            "--exact-output",
        )
    )
    assert cfg.tokenizer == "server"
    assert cfg.workload == {"kind": "synthetic", "exact_output": True}
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        'requests = 2\nconcurrency = 1\n[workload]\nkind = "chat"\nchars_per_token = 3.0\n'
    )
    cfg = run_cmd.config_from_args(_args("--scenario", str(scenario), "--tokenizer", "byte"))
    assert cfg.workload["kind"] == "chat" and cfg.tokenizer == "byte"
    assert "chars_per_token" not in cfg.workload  # the flag replaces the scenario's estimate


def test_prompts_are_sized_exactly_by_default(tmp_path: Path) -> None:
    """auto, RunConfig's default, for an endpoint and the embedded reference server alike; a
    scenario's chars_per_token, or --tokenizer none, sends estimates."""
    load = ("--concurrency", "1", "--requests", "2")
    assert RunConfig(concurrency=1, requests=1).tokenizer == "auto"
    cfg = run_cmd.config_from_args(_args("--endpoint", "http://h:1", *load))
    assert cfg.tokenizer == "auto" and "tokenizer" not in cfg.workload
    assert run_cmd.config_from_args(_args(*load)).tokenizer == "auto"
    none = run_cmd.config_from_args(_args("--endpoint", "http://h:1", *load, "--tokenizer", "none"))
    assert none.tokenizer == "none" and size_prompts(none, none.endpoints[0]) is None
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        'requests = 2\nconcurrency = 1\n[workload]\nkind = "chat"\nchars_per_token = 3.0\n'
    )
    cfg = run_cmd.config_from_args(_args("--scenario", str(scenario), "--endpoint", "http://h:1"))
    assert cfg.workload["chars_per_token"] == 3.0 and size_prompts(cfg, cfg.endpoints[0]) is None
    byte = size_prompts(cfg.replace(workload={"kind": "chat"}, tokenizer="byte"), cfg.endpoints[0])
    assert byte is not None and byte.tokens is not None and byte.fitter is not None


def test_overlapping_runs_share_the_stop_signals_and_put_back_the_old_handlers() -> None:
    """Runs overlapping in one process (the lab's parts): a SIGINT stops both, and only when
    the last ends are the handlers from before put back (restoring them run by run, in any
    order, closed a wakeup socket still in use: the lab's first round failed on it)."""
    import itertools
    import os
    import signal

    from loadlab._runner import signals
    from loadlab._runner.endpoint import run_endpoint

    endpoint = EndpointConfig(url="http://127.0.0.1:1", name="x")
    slow = RunConfig(concurrency=2, duration_s=30, progress=False, prompt_tokens=4)
    short = RunConfig(concurrency=2, requests=4, progress=False, prompt_tokens=4)

    def specs(cfg: RunConfig) -> list[RequestSpec]:
        return list(itertools.islice(build_requests(cfg), 1000))

    async def go() -> tuple[object, object]:
        def factory(e: EndpointConfig, c: RunConfig) -> FakeClient:
            return FakeClient(ttft_s=0.05, itl_s=0.05, tokens=4)

        long_run = asyncio.ensure_future(
            run_endpoint(slow, endpoint, specs(slow), client_factory=factory, scrape=False)
        )
        first = await run_endpoint(short, endpoint, specs(short), client_factory=factory,
                                   scrape=False)  # fmt: skip
        assert first.records and signal.getsignal(signal.SIGINT) is not before
        os.kill(os.getpid(), signal.SIGINT)  # the short run is over: the long one stops
        return first, await asyncio.wait_for(long_run, 20)

    with signals.install():
        before = signal.getsignal(signal.SIGINT)
        t0 = time.monotonic()
        _first, stopped = asyncio.run(go())
        after = signal.getsignal(signal.SIGINT)
        received = signals.first_received()
    assert after is before and received == signal.SIGINT
    assert time.monotonic() - t0 < 15  # stopped, not run for its 30 s
    assert stopped.records and stopped.extra.get("interrupted", True)  # type: ignore[attr-defined]
    # The signal belonged to that command: a later run in this process is not stopped by it
    # (it was, and every later test's run came back empty).
    later = asyncio.run(
        run_endpoint(short, endpoint, specs(short), scrape=False,
                     client_factory=lambda e, c: FakeClient(ttft_s=0.01))
    )  # fmt: skip
    assert len(later.records) == 4 and all(r.ok for r in later.records)
