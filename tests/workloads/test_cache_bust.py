"""``--cache-bust`` ("start cold") on any workload: its prompts are unseen by the server's
prefix cache, while the workload keeps its kind, lengths and schedule (it turned a chat
scenario into a 1,024-token prefix workload)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from loadlab._commands.run import add_arguments, config_from_args
from loadlab.cli import main
from loadlab.config import RunConfig
from loadlab.results import read_results
from loadlab.workloads import build_requests
from loadlab.workloads._exact import tokenizer_sizing
from tests.helpers.loopback import ROOT

CHAT = {"kind": "chat", "sessions": 6, "turns": 3, "think_time_s": 0.05,
        "prompt_tokens": {"dist": "uniform", "low": 40, "high": 120}, "output_tokens": 16}  # fmt: skip
BYTE = tokenizer_sizing("byte", "chat")  # prompts sized as the reference server counts them


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_the_flag_keeps_the_scenarios_workload() -> None:
    cfg = config_from_args(_args("--scenario", str(ROOT / "scenarios/chat.toml"), "--cache-bust"))
    assert cfg.workload["kind"] == "chat" and cfg.workload["cache_bust"] is True
    assert "prefix_tokens" not in cfg.workload
    demo = config_from_args(_args("--cache-bust"))  # the embedded demo's chat, salted
    assert demo.workload["kind"] == "chat" and demo.workload["cache_bust"] is True
    prefix = config_from_args(_args("--prefix-tokens", "64", "--cache-bust"))
    assert prefix.workload["kind"] == "prefix" and prefix.workload["cache_bust"] is True


@pytest.mark.parametrize("kind", ["chat", "synthetic", "batch"])
def test_salted_prompts_keep_every_length_and_differ_from_every_earlier_run(kind: str) -> None:
    workload = CHAT if kind == "chat" else {"kind": kind, "prompt_tokens": 80,
                                            "output_tokens": 8}  # fmt: skip
    cfg = RunConfig(concurrency=2, requests=18, seed=3, workload=workload)
    plain = list(build_requests(cfg, BYTE))
    runs = [list(build_requests(cfg.replace(workload={**workload, "cache_bust": True}), BYTE))
            for _ in range(2)]  # fmt: skip
    for salted in runs:
        assert len(salted) == len(plain)
        for a, b in zip(plain, salted, strict=True):
            assert (a.request_id, a.session_id, a.turn, a.prompt_tokens, a.max_tokens) == (
                b.request_id, b.session_id, b.turn, b.prompt_tokens, b.max_tokens)  # fmt: skip
            assert len(a.prompt) == len(b.prompt) and a.prompt != b.prompt
            # no 16-character block (one KV block of the byte tokenizer) starts alike
            assert a.prompt[:16] != b.prompt[:16]
    assert all(a.prompt[:16] != b.prompt[:16] for a, b in zip(*runs, strict=True))


def test_a_salted_chat_rerun_starts_cold_and_still_shares_its_own_history(
    tmp_path: Path,
) -> None:
    """Against the reference server (prefix caching on): the same seeded chat run twice finds
    its first turns cached the second time; with --cache-bust it finds none of them, and its
    later turns still hit their own sessions' history."""
    launch = pytest.importorskip("reference_server.launch")
    scenario = tmp_path / "chat.toml"
    scenario.write_text(
        'concurrency = 3\nrequests = 18\nseed = 5\n[workload]\nkind = "chat"\nsessions = 6\n'
        "turns = 3\nthink_time_s = 0.05\nprompt_tokens = 96\noutput_tokens = 16\n"
    )
    run = ["run", "--scenario", str(scenario), "--no-progress",
           "--saturation-lag-ms", "100000"]  # fmt: skip

    def first_and_later(path: Path) -> tuple[int, int]:
        recs = [r for r in read_results(path).records if r.ok]
        first = sum(r.cached_prompt_tokens or 0 for r in recs if r.turn == 0)
        return first, sum(r.cached_prompt_tokens or 0 for r in recs if r.turn > 0)

    with launch.start_server(mode="continuous", preset="fake", timeout_s=90) as server:
        url = ["--endpoint", server.url]
        assert main([*run, *url, "--out", str(tmp_path / "a.json")]) == 0
        assert main([*run, *url, "--out", str(tmp_path / "b.json")]) == 0
        assert main([*run, *url, "--cache-bust", "--out", str(tmp_path / "c.json")]) == 0
    assert first_and_later(tmp_path / "a.json")[0] == 0  # a cold server
    assert first_and_later(tmp_path / "b.json")[0] >= 6 * 80  # warm: the same first turns
    first, later = first_and_later(tmp_path / "c.json")
    assert first == 0 and later > 0
    assert (first, later) == first_and_later(tmp_path / "a.json")  # as cold as the first run
    results = read_results(tmp_path / "c.json")
    assert results.extra["workload"]["kind"] == "chat"
    assert [r.prompt_tokens for r in results.records if r.turn == 0] == [96] * 6
