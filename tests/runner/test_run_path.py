"""One run path for every caller (``loadlab._runner.run``): the command line and the Python API
send the same load, a mix runs from the command line, each run draws its own seed, and each
endpoint's prompt sizing goes explicitly to what builds its requests.

The servers are ``tests.helpers.recorder.RecordingServer`` on loopback, in a thread of this
process: they keep every chat request body, so the tests compare what was really sent."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import loadlab
from loadlab._analysis.token_checks import prompt_match
from loadlab._runner.prompt_sizing import size_prompts
from loadlab._runner.run import Prepared, run
from loadlab.config import EndpointConfig, RunConfig
from loadlab.results import Results, read_results
from loadlab.workloads import build_requests
from tests.helpers.loopback import ROOT, serve_in_thread
from tests.helpers.recorder import RecordingServer

# prompt lengths drawn per request: a sizing that misses shows in the server's counts
WORKLOAD = {"kind": "synthetic", "prompt_tokens": {"dist": "uniform", "low": 20, "high": 120}}


def _server(**kw: Any) -> Callable[[], Iterator[RecordingServer]]:
    def fixture() -> Iterator[RecordingServer]:
        yield from serve_in_thread(lambda: RecordingServer(**kw))

    return fixture


words = pytest.fixture(scope="module")(_server(count="words"))  # answers /tokenize
words2 = pytest.fixture(scope="module")(_server(count="words"))
calibrated = pytest.fixture(scope="module")(_server(count="words", tokenize=False))
byte = pytest.fixture(scope="module")(_server(count="bytes"))


@pytest.fixture
def fresh(request: pytest.FixtureRequest) -> Callable[[str], RecordingServer]:
    """A module server with its recorded bodies cleared."""

    def get(name: str) -> RecordingServer:
        srv: RecordingServer = request.getfixturevalue(name)
        srv.bodies.clear()
        return srv

    return get


def _loadlab(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "loadlab", "run", "--no-progress", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def _key(body: dict[str, Any]) -> str:
    return json.dumps(body, sort_keys=True)


def _lengths(results: Results) -> list[tuple[int | None, int | None]]:
    return sorted((r.prompt_tokens_requested, r.prompt_tokens) for r in results.records)


def _prompts(bodies: list[dict[str, Any]]) -> list[str]:
    return [b["messages"][-1]["content"] for b in bodies if b.get("stream")]


def test_the_command_and_run_sync_send_the_same_load(
    fresh: Callable[[str], RecordingServer], tmp_path: Path
) -> None:
    """Same settings, same seed: the same request bodies (prompts included) and the same
    prompt lengths, exact as the server counts them (its /tokenize, asked by ``auto``, the
    default of both)."""
    srv = fresh("words")
    scenario = tmp_path / "w.toml"
    scenario.write_text(
        '[workload]\nkind = "synthetic"\nprompt_tokens = { dist = "uniform", low = 20, high = 120 }\n'
    )
    out = tmp_path / "cli.json"
    done = _loadlab("--endpoint", srv.url, "--scenario", str(scenario), "--concurrency", "2",
                    "--requests", "8", "--max-tokens", "4", "--seed", "11", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    by_cli = list(srv.bodies)
    srv.bodies.clear()
    cfg = RunConfig(endpoints=(EndpointConfig(url=srv.url),), concurrency=2, requests=8,
                    max_tokens=4, seed=11, progress=False, workload=WORKLOAD)  # fmt: skip
    results = loadlab.run_sync(cfg)
    assert len(by_cli) == 8 and sorted(map(_key, by_cli)) == sorted(map(_key, srv.bodies))
    cli = read_results(out)
    assert _lengths(cli) == _lengths(results)
    match = prompt_match(results.records)
    assert match.compared == 8 and match.exact == 8, match  # 20..120 words, not characters
    assert cli.config["seed"] == results.config["seed"] == 11
    assert cli.config["tokenizer"] == results.config["tokenizer"] == "auto"


def test_a_mix_runs_from_the_command_line(
    fresh: Callable[[str], RecordingServer], tmp_path: Path
) -> None:
    """The README's reasoning mix, shortened: both classes run, each chat part asking for its
    own reasoning effort; the exit code is the SLO verdict's, not a refusal of the input."""
    srv = fresh("byte")
    out = tmp_path / "mix.json"
    slo = ROOT / "examples" / "slo-reasoning.toml"
    done = _loadlab("--scenario", "scenarios/reasoning_mix.toml", "--endpoint", srv.url,
                    "--slo", str(slo), "--rate", "20", "--requests", "4", "--max-tokens", "4",
                    "--exact-output", "--out", str(out))  # fmt: skip
    assert "unknown key" not in done.stderr and out.is_file(), done.stderr
    results = read_results(out)
    assert {r.request_class for r in results.records} == {"chat", "agent"}
    assert all(r.ok for r in results.records)
    assert done.returncode == loadlab.evaluate(results, slo).exit_code
    assert {b.get("reasoning_effort") for b in srv.bodies} == {"low"}
    assert all(b.get("ignore_eos") is True for b in srv.bodies)  # --exact-output, every part


def test_each_run_draws_its_seed_and_a_given_seed_repeats_it(
    fresh: Callable[[str], RecordingServer], tmp_path: Path
) -> None:
    srv = fresh("byte")
    args = ("--endpoint", srv.url, "--concurrency", "2", "--requests", "6", "--max-tokens", "2")
    runs, seeds = [], []
    for i in range(2):
        srv.bodies.clear()
        done = _loadlab(*args, "--out", str(tmp_path / f"r{i}.json"))
        assert done.returncode == 0, done.stderr
        seed = read_results(tmp_path / f"r{i}.json").config["seed"]
        assert isinstance(seed, int) and f"seed {seed} (drawn for this run" in done.stderr
        runs.append(_prompts(srv.bodies))
        seeds.append(seed)
    assert seeds[0] != seeds[1]
    # no prompt of the second run starts as one of the first's past the request tag: a prefix
    # cache holds nothing of the first run that the second could use (16-token blocks)
    tag = len("syn-000000 ")
    assert all(a[: tag + 32] != b[: tag + 32] for a in runs[0] for b in runs[1])
    srv.bodies.clear()
    again = _loadlab(*args, "--seed", str(seeds[0]), "--out", str(tmp_path / "again.json"))
    assert again.returncode == 0 and "drawn" not in again.stderr
    assert sorted(_prompts(srv.bodies)) == sorted(runs[0])
    cfg = RunConfig(endpoints=(EndpointConfig(url=srv.url),), concurrency=1, requests=1,
                    max_tokens=1, progress=False)  # fmt: skip
    api = [loadlab.run_sync(cfg) for _ in range(2)]
    assert api[0].config["seed"] != api[1].config["seed"]


def test_the_endpoints_of_one_command_get_the_same_requests_in_other_words(
    fresh: Callable[[str], RecordingServer], tmp_path: Path
) -> None:
    """Two endpoints, one seed: the same ids and lengths, different text, so two names for
    one server do not find each other's prompts in its cache."""
    a, b = fresh("words"), fresh("words2")
    done = _loadlab("--endpoint", f"a={a.url}", "--endpoint", f"b={b.url}", "--concurrency", "2",
                    "--requests", "6", "--max-tokens", "2", "--seed", "3",
                    "--out", str(tmp_path / "x.json"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    ra, rb = read_results(tmp_path / "x-a.json"), read_results(tmp_path / "x-b.json")
    assert sorted(r.request_id for r in ra.records) == sorted(r.request_id for r in rb.records)
    assert _lengths(ra) == _lengths(rb)
    assert not set(_prompts(a.bodies)) & set(_prompts(b.bodies))


def test_each_endpoint_gets_its_own_sizing_explicitly(
    fresh: Callable[[str], RecordingServer],
) -> None:
    """Two endpoints that count differently, sized in one process: each one's requests are
    exact in its own count, whatever was sized or built before for the other."""
    w, by = fresh("words"), fresh("byte")
    cfg = RunConfig(concurrency=1, requests=6, seed=5, workload=WORKLOAD)
    pw, pb = (Prepared(ep, size_prompts(cfg, ep)) for ep in
              (EndpointConfig(url=w.url, name="w"), EndpointConfig(url=by.url, name="b")))  # fmt: skip
    in_words = list(pw.build(cfg))
    in_bytes = list(pb.build(cfg))
    assert [s.prompt for s in pw.build(cfg)] == [s.prompt for s in in_words]  # nothing shared
    for srv, specs in ((w, in_words), (by, in_bytes)):
        counted = [srv.prompt_tokens({"messages": [{"content": s.prompt}]}) for s in specs]
        assert counted == [s.prompt_tokens for s in specs]
    assert [s.prompt_tokens for s in in_words] == [s.prompt_tokens for s in build_requests(cfg)]


def test_workers_get_the_sizing_from_the_parent(
    fresh: Callable[[str], RecordingServer], tmp_path: Path
) -> None:
    """With --workers 2 the endpoint is calibrated once (two one-token requests), in the
    parent, not again in each worker."""
    srv = fresh("calibrated")
    out = tmp_path / "w.json"
    results = run(
        RunConfig(endpoints=(EndpointConfig(url=srv.url),), concurrency=2, requests=8,
                  max_tokens=2, workers=2, progress=False, out=str(out), workload=WORKLOAD),
        log=lambda line: None,
    ).runs[0].results  # fmt: skip
    calibration = [b for b in srv.bodies if not b.get("stream")]
    assert len(calibration) == 2 and len(srv.bodies) == 10
    assert {r.worker for r in results.records} == {0, 1} and out.is_file()
    assert all(r.ok for r in results.records)
