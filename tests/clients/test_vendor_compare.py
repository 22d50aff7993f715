"""Vendor comparison in one command: ``loadlab run`` against the real reference server (tiny
torch model, OpenAI dialect) and the fixed-schedule server speaking the Anthropic Messages API,
each endpoint with its own model, API and key variable; the run ends with the comparison,
printed and written."""

from __future__ import annotations

import argparse
import importlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab._commands.run import add_arguments, config_from_args
from loadlab.cli import main
from loadlab.results import read_results
from loadlab.selftest._fixed_server import FixedScheduleServer

launch = pytest.importorskip("reference_server.launch")


@pytest.fixture(scope="module")
def reference_url() -> Iterator[str]:
    # scipy (loadlab._analysis.compare) takes seconds to import on a busy machine: do it while the
    # server process loads torch, instead of after
    mods = ("loadlab._analysis.compare", "loadlab._report.comparison", "loadlab._runner.runner")
    warm = threading.Thread(target=lambda: [importlib.import_module(m) for m in mods])
    warm.start()
    try:
        with launch.start_server(mode="continuous", preset="tiny", timeout_s=90) as server:
            yield server.url
    finally:
        warm.join(60)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_each_endpoint_takes_its_own_model_api_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["--endpoint", "a=http://h:1", "--endpoint", "b=http://h:2", "--model", "m"]
    argv += ["--endpoint-api", "b=anthropic", "--endpoint-model", "b=claude-x"]
    argv += ["--endpoint-key-env", "b=B_KEY", "--concurrency", "1", "--requests", "1"]
    a, b = config_from_args(_parse(argv)).endpoints
    assert (a.name, a.api, a.model, a.api_key_env) == ("a", "chat", "m", None)
    assert (b.name, b.api, b.model, b.api_key_env) == ("b", "anthropic", "claude-x", "B_KEY")
    with pytest.raises(ValueError, match="no endpoint named 'c'; endpoints: a, b"):
        config_from_args(_parse([*argv, "--endpoint-model", "c=x"]))
    with pytest.raises(ValueError, match="--endpoint-api must look like NAME=VALUE"):
        config_from_args(_parse([*argv, "--endpoint-api", "anthropic"]))


def test_scenario_endpoints_take_their_own_model_api_and_key(tmp_path: Path) -> None:
    scenario = tmp_path / "vendors.toml"
    scenario.write_text(
        'concurrency = 1\nrequests = 1\n[[endpoints]]\nname = "ours"\nurl = "http://h:1"\n'
        '[[endpoints]]\nname = "claude"\nurl = "https://h:2"\napi = "anthropic"\n'
        'model = "claude-x"\napi_key_env = "C_KEY"\n'
    )
    ours, claude = config_from_args(_parse(["--scenario", str(scenario)])).endpoints
    assert (ours.api, ours.model) == ("chat", "loadlab-ref")
    assert (claude.api, claude.model, claude.api_key_env) == ("anthropic", "claude-x", "C_KEY")
    # a flag for one endpoint wins over its table
    argv = ["--scenario", str(scenario), "--endpoint-model", "claude=claude-y"]
    assert config_from_args(_parse(argv)).endpoints[1].model == "claude-y"


def test_reference_vs_anthropic_in_one_command(
    reference_url: str,
    fixed_server: FixedScheduleServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("LOADLAB_TEST_VENDOR_KEY", "sk-vendor-canary-1234")
    out = tmp_path / "vs.json"
    argv = ["run", "--endpoint", f"ref={reference_url}", "--endpoint", f"claude={fixed_server.url}",
            "--endpoint-api", "claude=anthropic", "--endpoint-model", "claude=claude-test",
            "--endpoint-key-env", "claude=LOADLAB_TEST_VENDOR_KEY",
            "--concurrency", "2", "--requests", "8", "--prompt-tokens", "16", "--max-tokens", "6",
            "--interleave", "--no-progress", "--out", str(out),
            # the plumbing is under test, not this busy machine's event loop
            "--saturation-lag-ms", "100000"]  # fmt: skip
    code = main(argv)
    printed = capsys.readouterr().out
    assert code == 0, printed
    ref = read_results(tmp_path / "vs-ref.json")
    claude = read_results(tmp_path / "vs-claude.json")
    for res, name in ((ref, "ref"), (claude, "claude")):
        assert [r.outcome for r in res.records] == ["ok"] * 8, name
        assert {r.endpoint for r in res.records} == {name}
        assert all(r.output_tokens_source == "usage" for r in res.records)
    # each endpoint's prompts sized by its own count: bytes on ours, the vendor's by calibration
    assert ref.extra["workload"]["prompt_fit"]["method"] == "reference server: byte"
    assert claude.extra["workload"]["prompt_fit"]["method"].startswith("calibrated")
    # the same seeded requests went to both
    assert sorted(r.request_id for r in ref.records) == sorted(r.request_id for r in claude.records)
    # the Anthropic dialect: every token timed, the fixed server's stop reason, its usage
    assert all(len(r.chunk_ns) == r.output_tokens == 6 for r in claude.records)
    assert {r.finish_reason for r in claude.records} == {"max_tokens"}
    assert all(r.request_id in fixed_server.truth for r in claude.records)
    # the comparison, printed and written
    assert "ttft_ms.p50" in printed and "claude" in printed
    md = (tmp_path / "vs.compare.md").read_text()
    assert "ttft_ms.p50" in md
    cmp = json.loads((tmp_path / "vs.compare.json").read_text())
    assert cmp["labels"] == ["ref", "claude"]
    assert {row["metric"] for row in cmp["rows"]} >= {"ttft_ms.p50", "error_rate"}
    for path in tmp_path.iterdir():
        assert "sk-vendor-canary-1234" not in path.read_text()


@pytest.mark.slow
def test_reference_server_in_two_modes_in_one_command(
    reference_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # End to end: the same seeded requests to the reference server in two
    # modes (the module's continuous server and a static one), then the comparison
    static = launch.RunningServer(mode="static", preset="tiny", extra_args=["--threads", "1"])
    try:
        static.wait_ready(timeout_s=90)
        out = tmp_path / "modes.json"
        argv = ["run", "--endpoint", f"continuous={reference_url}",
                "--endpoint", f"static={static.url}",
                "--concurrency", "4", "--requests", "12", "--prompt-tokens", "24",
                "--max-tokens", "8", "--no-progress", "--out", str(out),
                "--saturation-lag-ms", "100000"]  # fmt: skip
        code = main(argv)
        printed = capsys.readouterr().out
    finally:
        static.stop()
    assert code == 0, printed
    runs = {n: read_results(tmp_path / f"modes-{n}.json") for n in ("continuous", "static")}
    for name, res in runs.items():
        assert [r.outcome for r in res.records] == ["ok"] * 12, name
        assert all(r.output_tokens == 8 for r in res.records), name
    ids = [sorted(r.request_id for r in res.records) for res in runs.values()]
    assert ids[0] == ids[1]
    cmp = json.loads((tmp_path / "modes.compare.json").read_text())
    assert cmp["labels"] == ["continuous", "static"]
