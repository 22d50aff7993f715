"""Scenario files: the shipped ones load, errors are precise, seeds reproduce request lists."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loadlab._slo import load_slo
from loadlab.config import RunConfig
from loadlab.scenario import ScenarioError, load_scenario
from loadlab.workloads import build_requests
from loadlab.workloads._params import TRACES

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"


def write(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def error_of(path) -> str:
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return str(info.value)


@pytest.mark.parametrize(
    "name", ["chat", "batch", "azure_conv", "agent", "reasoning_mix", "prefix_pool", "dataset"]
)
def test_shipped_scenarios_load_and_build(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_scenario(f"scenarios/{name}.toml")
    assert isinstance(cfg, RunConfig)
    assert cfg.workload["kind"] in ("chat", "batch", "trace", "agent", "mix", "prefix", "dataset")
    specs = list(build_requests(cfg))
    assert specs
    if name == "chat":
        assert len(specs) == 100 and {s.turn for s in specs} == {0, 1, 2, 3, 4}
    if name == "prefix_pool":  # 4 prefixes x 16 requests; salted, so only the salt differs
        assert len(specs) == 64 and len({s.prompt[:6] for s in specs}) == 4
    if name == "azure_conv":
        assert cfg.workload["trace"] == "azure-2023-conv" and len(specs) == 191
    if name == "agent":  # 20 sessions of a task and 3 tool rounds, on a reasoning model
        assert len(specs) == 80 and sum(s.tool_turn for s in specs) == 60
        assert {s.reasoning_effort for s in specs} == {"low"} and specs[0].tools
    if name == "reasoning_mix":  # the classes examples/slo-reasoning.toml names
        assert len(specs) == 200 and {s.request_class for s in specs} == {"chat", "agent"}


def test_the_reasoning_slo_example_loads() -> None:
    spec = load_slo(ROOT / "examples" / "slo-reasoning.toml")
    assert "ttfat_ms.p95[chat] <= 8000" in [str(o) for o in spec.objectives]
    assert {o.request_class for o in spec.objectives} == {None, "chat", "agent"}


def test_same_scenario_and_seed_give_the_same_requests(monkeypatch):
    monkeypatch.chdir(ROOT)
    for name in ("chat", "batch", "azure_conv", "dataset"):
        a = list(build_requests(load_scenario(f"scenarios/{name}.toml", overrides={"seed": 1})))
        b = list(build_requests(load_scenario(f"scenarios/{name}.toml", overrides={"seed": 1})))
        assert a == b
    other = load_scenario("scenarios/chat.toml", overrides={"seed": 2})
    chat1 = list(build_requests(load_scenario("scenarios/chat.toml")))
    chat2 = list(build_requests(other))
    assert [s.prompt for s in chat1] != [s.prompt for s in chat2]


def test_negative_rate_names_file_field_value_and_fix(tmp_path):
    p = write(tmp_path, "rate_rps = -1\nrequests = 10\n", name="chat.toml")
    assert error_of(p) == (
        f"{p}: rate_rps = -1: must be > 0; for closed loop set concurrency instead"
    )


def test_typo_names_the_closest_key(tmp_path):
    assert error_of(write(tmp_path, "rate_rsp = 2\nrequests = 10\n")).endswith(
        "rate_rsp: unknown key; did you mean 'rate_rps'?"
    )
    msg = error_of(
        write(tmp_path, 'rate_rps = 2\nrequests = 10\n[workload]\nkind = "chat"\nturnz = 3\n')
    )
    assert msg.endswith("workload.turnz: unknown key for kind 'chat'; did you mean 'turns'?")
    msg = error_of(
        write(
            tmp_path,
            'concurrency = 1\nrequests = 1\n[[endpoints]]\nurl = "http://127.0.0.1:1"\nmodle = "m"\n',
        )
    )
    assert msg.endswith("endpoints[0].modle: unknown key; did you mean 'model'?")


def test_wrong_type_and_missing_load(tmp_path):
    assert 'requests = "ten": input should be a valid integer' in error_of(
        write(tmp_path, 'rate_rps = 2\nrequests = "ten"\n')
    )
    assert "set rate_rps = N (open loop" in error_of(write(tmp_path, "requests = 3\n"))
    assert "not both" in error_of(write(tmp_path, "rate_rps = 1\nconcurrency = 2\nrequests = 3\n"))
    assert "no stop rule" in error_of(write(tmp_path, "rate_rps = 1\n"))


def test_bad_toml_and_missing_file(tmp_path):
    assert "not valid TOML" in error_of(write(tmp_path, "rate_rps = = 1\n"))
    assert "scenario file not found" in error_of(tmp_path / "nope.toml")


def test_workload_file_paths_resolve_next_to_the_scenario(tmp_path):
    shutil.copy(TRACES["azure-2023-code"], tmp_path / "t.csv")
    p = write(tmp_path, 'rate_rps = 1\nrequests = 3\n[workload]\nkind = "trace"\npath = "t.csv"\n')
    assert load_scenario(p).workload["path"] == str(tmp_path / "t.csv")
    missing = write(
        tmp_path, 'rate_rps = 1\nrequests = 3\n[workload]\nkind = "trace"\npath = "gone.csv"\n'
    )
    assert "workload.path = 'gone.csv': file not found" in error_of(missing)


def test_overrides_win_and_switch_the_load_mode(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_scenario("scenarios/batch.toml", overrides={"rate_rps": 3.0, "requests": None})
    assert cfg.rate_rps == 3.0 and cfg.concurrency is None and cfg.requests == 64


def test_malformed_trace_line_fails_the_scenario_before_any_load(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00+00:00,5,5\n"
        "2024-01-01 00:00:01+00:00,5\n"
    )
    p = write(tmp_path, 'rate_rps = 1\nrequests = 3\n[workload]\nkind = "trace"\npath = "t.csv"\n')
    assert f"{trace}:3: malformed azure line (expected 3 fields" in error_of(p)
    unknown = tmp_path / "u.csv"
    unknown.write_text("a,b\n1,2\n")
    p = write(tmp_path, 'rate_rps = 1\nrequests = 3\n[workload]\nkind = "trace"\npath = "u.csv"\n')
    assert "unknown trace format" in error_of(p)


def test_tokenizer_file_without_the_package_fails_up_front(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    p = write(tmp_path, 'rate_rps = 1\nrequests = 3\ntokenizer = "tokenizer.json"\n')
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        assert "pip install tokenizers" in error_of(p)
    else:
        pytest.skip("tokenizers is installed")


def test_a_tokenizer_in_the_workload_table_says_where_it_goes(tmp_path):
    """The tokenizer is a setting of the run (a mix's table never took it): the message names
    the file, the key and where to write it instead."""
    for workload in ('kind = "chat"', 'kind = "mix"\n[[workload.mix]]\nkind = "chat"'):
        body = f'rate_rps = 1\nrequests = 3\n[workload]\ntokenizer = "byte"\n{workload}\n'
        p = write(tmp_path, body)
        assert error_of(p) == (
            f"{p}: workload.tokenizer: the tokenizer is a setting of the run, not of its "
            "workload: write `tokenizer = ...` at the top of the scenario file (before any "
            "[table]), give --tokenizer, or RunConfig(tokenizer=...)"
        )
    p = write(tmp_path, 'tokenizer = "byte"\nrate_rps = 1\nrequests = 3\n[workload]\nkind = "mix"\n'
              '[[workload.mix]]\nkind = "chat"\n')  # fmt: skip
    assert load_scenario(p).tokenizer == "byte"
    p = write(tmp_path, 'rate_rps = 1\nrequests = 3\n[workload]\nkind = "mix"\nturns = 2\n'
              '[[workload.mix]]\nkind = "chat"\n')  # fmt: skip
    assert error_of(p).startswith(f"{p}: workload.turns: unknown key for kind 'mix'; valid keys")
