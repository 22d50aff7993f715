"""One run over several machines: ``--shard K/N``, ``--start-at`` and ``loadlab merge``."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadlab._runner.shard import partition, run_id, shard_specs
from loadlab.config import RunConfig
from loadlab.selftest._fixed_server import FixedServerProcess
from loadlab.workloads import build_requests
from tests.helpers.loopback import ROOT

CHAT = {"kind": "chat", "sessions": 7, "turns": 3, "think_time_s": 0.05, "prompt_tokens": 16,
        "output_tokens": 4}  # fmt: skip


def _key(specs: object) -> list[tuple[str, float | None, int]]:
    return sorted((s.request_id, s.intended_at_s, s.turn) for s in specs)  # type: ignore[attr-defined]


def test_the_shards_together_are_the_one_machine_schedule() -> None:
    cfg = RunConfig(rate_rps=5, requests=20, seed=3, workload=CHAT, tokenizer="none")
    whole = _key(build_requests(cfg))
    parts = [list(shard_specs(cfg.replace(shard=(k, 3)), build_requests(cfg))) for k in range(3)]
    assert sorted(x for p in parts for x in _key(p)) == whole
    for p in parts:  # a session never spans two shards
        sessions = {s.session_id for s in p}
        assert all(s.session_id in sessions for s in p)
    others = [{s.session_id for s in p} for p in parts]
    assert not (others[0] & others[1]) and not (others[1] & others[2])
    assert list(partition(range(0), 2, 0)) == []  # type: ignore[arg-type]


def test_a_shard_needs_a_seed_and_a_valid_part() -> None:
    from loadlab.errors import ConfigError

    with pytest.raises(ConfigError, match="--shard needs --seed"):
        RunConfig(concurrency=1, requests=1, shard=(0, 2))
    with pytest.raises(ConfigError, match="--shard K"):
        RunConfig(concurrency=1, requests=1, shard=(2, 2), seed=1)
    a = RunConfig(rate_rps=5, requests=20, seed=3, shard=(0, 2), out="a.json")
    assert run_id(a) == run_id(a.replace(shard=(1, 2), out="b.json"))
    assert run_id(a) != run_id(a.replace(seed=4))


def _loadlab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadlab", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.mark.slow
def test_shards_started_together_merge_into_the_one_machine_run(tmp_path: Path) -> None:
    with FixedServerProcess(ttft_ms=10, itl_ms=2, tokens=8) as url:
        start = f"{time.time() + 6:.3f}"
        common = ["run", "--endpoint", url, "--rate", "20", "--requests", "60", "--seed", "11",
                  "--tokenizer", "none", "--no-progress", "--start-at", start]  # fmt: skip
        procs = [
            subprocess.Popen([sys.executable, "-m", "loadlab", *common, "--shard", f"{k}/3",
                              "--out", str(tmp_path / f"s{k}.json")], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for k in range(3)
        ]  # fmt: skip
        for p in procs:
            _out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]
        single = _loadlab("run", "--endpoint", url, "--rate", "20", "--requests", "60",
                          "--seed", "11", "--tokenizer", "none", "--no-progress",
                          "--out", str(tmp_path / "one.json"))  # fmt: skip
        assert single.returncode == 0, single.stderr[-2000:]
    merged = _loadlab("merge", *(str(tmp_path / f"s{k}.json") for k in range(3)),
                      "--out", str(tmp_path / "merged.json"))  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    m = json.loads((tmp_path / "merged.json").read_text())
    one = json.loads((tmp_path / "one.json").read_text())
    key = lambda rs: sorted((r["request_id"], r["intended_ns"]) for r in rs)  # noqa: E731
    assert key(m["records"]) == key(one["records"])  # the same requests at the same times
    assert all(r["outcome"] == "ok" for r in m["records"])
    info = m["extra"]["shards"]
    assert info["merged"] == [0, 1, 2] and info["missing"] == []
    assert all(v is not None and v > -1000 for v in info["ready_before_start_ms"].values())
    # sends at the intended times from the common start: loose on a loaded test machine
    lags = [(r["sent_ns"] - r["intended_ns"]) / 1e6 for r in m["records"]]
    assert sorted(lags)[len(lags) // 2] < 50, lags

    assert {r["worker"] for r in m["records"]} == {0, 1, 2}  # each record's shard and host
    hosts = {str(k): h for k, h in info["hosts"].items()}
    assert all(r["host"] == hosts[str(r["worker"])] for r in m["records"])
    assert {len([r for r in m["records"] if r["worker"] == k]) for k in range(3)} == {20}

    report = _loadlab("report", str(tmp_path / "merged.json"))
    assert report.returncode == 0 and "TTFT" in report.stdout
    slo = tmp_path / "slo.toml"
    slo.write_text('objectives = ["ttft_ms.p50 <= 5000", "error_rate <= 0.5"]\n')
    verdict = _loadlab("slo", str(tmp_path / "merged.json"), "--slo", str(slo))
    assert verdict.returncode == 0 and "PASS" in verdict.stdout, verdict.stdout + verdict.stderr
    both = _loadlab("compare", str(tmp_path / "one.json"), str(tmp_path / "merged.json"))
    assert both.returncode == 0 and "ttft_ms.p50" in both.stdout, both.stdout + both.stderr
    missing = _loadlab("merge", str(tmp_path / "s0.json"), str(tmp_path / "s2.json"),
                       "--out", str(tmp_path / "part.json"))  # fmt: skip
    assert missing.returncode == 1 and "[1] of 3 are missing" in missing.stderr
    mixed = _loadlab("merge", str(tmp_path / "s0.json"), str(tmp_path / "one.json"),
                     "--out", str(tmp_path / "x.json"))  # fmt: skip
    assert mixed.returncode == 2 and "not a shard" in mixed.stderr


def test_merge_refuses_shards_of_two_runs(tmp_path: Path) -> None:
    from loadlab._analysis.shards import merge_shards
    from loadlab.errors import ConfigError
    from loadlab.results import Results

    def part(k: int, rid: str) -> Results:
        return Results(
            records=[], config={}, extra={"shard": {"index": k, "count": 2, "run_id": rid}}
        )

    with pytest.raises(ConfigError, match="another run"):
        merge_shards([part(0, "aaa"), part(1, "bbb")])
    with pytest.raises(ConfigError, match="both shard 0"):
        merge_shards([part(0, "aaa"), part(0, "aaa")])


def test_the_kubernetes_example_uses_real_flags() -> None:
    from loadlab._commands import run as run_command

    text = (ROOT / "docs" / "distributed.md").read_text()
    block = re.search(r"args:\n\s+- >-\n((?:\s{14}.+\n)+)", text)
    assert block, "no Indexed Job args in docs/distributed.md"
    command = " ".join(block.group(1).split()).replace("$(JOB_COMPLETION_INDEX)", "2")
    argv = command.split()
    assert argv[:2] == ["loadlab", "run"]
    parser = argparse.ArgumentParser(exit_on_error=False)
    run_command.add_arguments(parser)
    args = parser.parse_args(argv[2:])
    assert args.shard == (2, 4) and args.start_at == 1767225600.0 and args.seed == 7


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["sweep", "--rates", "1,2", "--shard", "0/2", "--seed", "1"], "sweep takes no --shard"),
        (["sweep", "--rates", "1,2", "--start-at", "1900000000"], "sweep takes no --start-at"),
        (
            ["simulate", "--rate", "2", "--requests", "10", "--shard", "1/3", "--seed", "2"],
            "simulate takes no --shard",
        ),
    ],
)
def test_a_sweep_or_a_simulation_refuses_shard_flags_before_any_request(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    said: str,
) -> None:
    """A sweep given ``--shard 0/2`` judged half of each level's load as the whole (and a
    simulation ignored it): both refuse, naming the flag, before anything is sent."""
    from loadlab.cli import main

    monkeypatch.chdir(tmp_path)  # where a sweep or a simulation that ran writes reports/
    slo = tmp_path / "slo.toml"
    slo.write_text('objectives = ["ttft_ms.p50 <= 1000"]\n')
    if argv[0] == "sweep":  # a closed port: a request sent would fail, not hang
        argv = [*argv, "--slo", str(slo), "--endpoint", "http://127.0.0.1:9", "--model", "m"]
    assert main(argv) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


def test_the_sweep_over_machines_example_uses_real_flags() -> None:
    """Every loadlab command of docs/distributed.md's sweep over several machines parses
    with its own command's flags, and the two shards share one schedule."""
    import importlib

    from loadlab.cli import COMMANDS

    def parse(argv: list[str]) -> argparse.Namespace:
        parser = argparse.ArgumentParser(exit_on_error=False)
        importlib.import_module(COMMANDS[argv[0]][0]).add_arguments(parser)
        return parser.parse_args(argv[1:])

    text = (ROOT / "docs" / "distributed.md").read_text()
    section = text.split("## A sweep over several machines", 1)[1]
    block = re.search(r"```bash\n(.+?)```", section, re.S)
    assert block, "no example in the section"
    lines = [re.sub(r"^ssh \S+ ", "", ln.strip()) for ln in block.group(1).splitlines()]
    commands = [ln.split("  #")[0].split(" || ")[0].split(" &")[0] for ln in lines]
    commands = [c.replace("$RATE", "200").replace("$START", "1900000000").replace("URL", "http://h:8000")
                for c in commands if c.startswith("loadlab ")]  # fmt: skip
    parsed = [parse(c.split()[1:]) for c in commands]
    assert [c.split()[1] for c in commands] == ["run", "run", "merge", "slo"]
    shards = parsed[:2]
    assert [p.shard for p in shards] == [(0, 2), (1, 2)]
    assert {(p.rate, p.duration, p.seed, p.start_at) for p in shards} == {
        (200.0, 60.0, 7, 1900000000.0)
    }
    assert str(parsed[2].out) == "level-200.json" and parsed[3].slo == "slo.toml"
