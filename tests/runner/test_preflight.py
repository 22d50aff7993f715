"""Before a run, against the reference server (fake preset) on loopback: a request that cannot
fit the server's context is refused with the numbers and the fix (exit 2, nothing sent);
without ``--model`` the server's own model is sent (``GET /v1/models``); the server's block
size and context are kept in the results file; error text is shortened at a boundary."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab._report.text import short_error
from loadlab.cli import main
from loadlab.journal import journal_path
from loadlab.results import read_results

launch = pytest.importorskip("reference_server.launch")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    flags = ["--model-name", "served-x", "--max-model-len", "256"]
    with launch.start_server(mode="continuous", preset="fake", extra_args=flags,
                             timeout_s=90) as server:  # fmt: skip
        yield server.url


def _requests_seen(url: str) -> int:
    with urllib.request.urlopen(url + "/v1/request_log", timeout=10) as r:  # noqa: S310
        return len(json.loads(r.read()))


RUN = ["run", "--concurrency", "2", "--requests", "4", "--no-progress",
       "--saturation-lag-ms", "100000"]  # fmt: skip


def test_a_request_that_cannot_fit_the_context_is_refused_before_the_run(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    seen = _requests_seen(url)
    code = main([*RUN, "--endpoint", url, "--model", "served-x", "--prompt-tokens", "300",
                 "--max-tokens", "16", "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "4 of the first 4 requests cannot fit the server's context of 256 tokens" in err
    assert "prompt 300 tokens + max_tokens 16 = 316" in err and "--prompt-tokens" in err
    assert not out.exists() and not journal_path(out).exists()
    assert _requests_seen(url) == seen  # nothing was sent


def test_a_chat_session_that_outgrows_the_context_is_refused_with_the_cut_to_set(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # turn 2 holds two earlier messages and answers: 2 x 128 + 4 separators + 128 = 388
    workload = {"kind": "chat", "turns": 3, "think_time_s": 0.01, "prompt_tokens": 64,
                "output_tokens": 64}  # fmt: skip
    scenario = tmp_path / "chat.toml"
    lines = [f"{k} = {json.dumps(v)}" for k, v in workload.items()]
    scenario.write_text("concurrency = 2\nrequests = 6\n[workload]\n" + "\n".join(lines) + "\n")
    code = main(["run", "--endpoint", url, "--scenario", str(scenario), "--no-progress",
                 "--out", str(tmp_path / "c.json")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "(turn 2: this message 64, the rest the session's history) + max_tokens 64 = 388" in err
    assert "set workload.max_context_tokens = 256" in err
    scenario.write_text(scenario.read_text() + "max_context_tokens = 256\n")
    assert main(["run", "--endpoint", url, "--scenario", str(scenario), "--no-progress",
                 "--saturation-lag-ms", "100000", "--out", str(tmp_path / "c.json")]) == 0  # fmt: skip


def test_without_model_the_served_model_is_sent_and_the_server_facts_kept(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    code = main([*RUN, "--endpoint", url, "--prompt-tokens", "64", "--max-tokens", "8",
                 "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert "no --model given; sending the server's model 'served-x' (GET /v1/models)" in err
    results = read_results(out)
    assert [r.outcome for r in results.records] == ["ok"] * 4
    assert results.config["endpoints"][0]["model"] == "served-x"
    info = results.extra["server_info"]
    assert (info["block_size"], info["max_model_len"], info["preset"]) == (16, 256, "fake")
    assert info["served_models"] == ["served-x"]


def test_an_error_body_is_shortened_to_its_message_and_at_a_word() -> None:
    body = ('HTTP 400: {"error":{"message":"prompt (1282 tokens) + max_tokens (256) exceeds '
            'the context of 1024 tokens; shorten the prompt or lower max_tokens","type":"inval')  # fmt: skip
    assert short_error(body) == (
        "HTTP 400: prompt (1282 tokens) + max_tokens (256) exceeds the context of 1024 "
        "tokens; shorten the prompt or lower max_tokens"
    )
    assert short_error("HTTP 500: " + '{"detail": "' + "x" * 300 + '"}') == "HTTP 500: {…}"
    long = "connection reset by peer while reading the response " * 5
    cut = short_error(long, 60)
    assert cut.endswith("…") and len(cut) <= 60 and long.startswith(cut[:-1])
    assert cut[:-1] == long[: len(cut) - 1] and long[len(cut) - 1] == " "  # at a word


def test_the_prefix_cache_section_uses_the_servers_block_size_and_says_why_a_figure_is_empty(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --cache-block-size: the expected hit rate is aligned to the block size the server
    reports; without --scrape the counters row says to add it; no bare "-"."""
    out = tmp_path / "p.json"
    code = main([*RUN, "--endpoint", url, "--prefix-tokens", "64", "--prefixes", "2",
                 "--suffix-tokens", "16", "--max-tokens", "4", "--out", str(out)])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    section = text[text.index("prefix cache") :].split("\n\n")[0]
    assert "(16-token blocks (the server's block_size))" in section
    assert "- (not scraped: add --scrape URL/metrics" in section
    assert not [line for line in section.splitlines() if line.rstrip().endswith(" -")]
    # a workload that does not count shared prefixes says why its expected rate is empty
    assert main([*RUN, "--endpoint", url, "--prompt-tokens", "32", "--max-tokens", "4",
                 "--out", str(tmp_path / "s.json")]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "expected hit rate" in text and "only a shared-prefix workload" in text
