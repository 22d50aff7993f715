"""A dataset in each shipped format drives ``loadlab run`` (the fixed-schedule server, chat
API: multi-turn conversations are sent with the answers received as history)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab.cli import main
from loadlab.results import read_results
from loadlab.selftest._fixed_server import FixedServerProcess
from loadlab.workloads._params import PACKAGE_DATA

SAMPLES = PACKAGE_DATA / "samples"
# file -> requests its sample makes (sharegpt: 3 conversations of 3 turns and 3 of one)
EXPECTED = {"sharegpt.json": 12, "custom.jsonl": 8, "hf.json": 6, "hf.parquet": 6, "hf.arrow": 6}


@pytest.fixture(scope="module")
def fast_url() -> Iterator[str]:
    with FixedServerProcess(ttft_ms=5, itl_ms=1, tokens=4) as url:
        yield url


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_format_drives_a_run(
    name: str, fast_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if name.endswith((".parquet", ".arrow")):
        pytest.importorskip("pyarrow")
    scenario = tmp_path / "ds.toml"
    scenario.write_text(
        f'concurrency = 2\nrequests = 100\nmax_tokens = 4\n[workload]\nkind = "dataset"\n'
        f'path = "{SAMPLES / name}"\noutput_tokens = 4\n'
    )
    out = tmp_path / "r.json"
    code = main(["run", "--scenario", str(scenario), "--endpoint", fast_url, "--no-progress",
                 "--tokenizer", "none", "--out", str(out)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert f"conversations, {EXPECTED[name]} requests; skipped:" in printed
    res = read_results(out)
    assert len(res.records) == EXPECTED[name] and all(r.ok for r in res.records)
    assert res.extra["workload"]["dataset"]["requests"] == EXPECTED[name]
    later = [r for r in res.records if r.turn > 0]
    if name == "sharegpt.json":  # each later turn went after its first, in one session
        assert len(later) == 6
        for r in later:
            first = next(f for f in res.records if f.session_id == r.session_id and f.turn == 0)
            assert r.sent_ns is not None and first.end_ns is not None
            assert r.sent_ns >= first.end_ns
