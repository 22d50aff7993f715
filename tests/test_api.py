"""The public Python API (``loadlab.__all__``): light to import, and each name does what the
command of the same job does."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

import loadlab
from loadlab._slo import load_slo
from loadlab.errors import ConfigError, SLOError
from loadlab.selftest._fixed_server import FixedScheduleServer
from tests.helpers.synth import make_results

ROOT = Path(__file__).resolve().parent.parent


def test_import_loadlab_loads_nothing_heavy() -> None:
    code = (
        "import sys, loadlab; heavy = {'numpy', 'pandas', 'aiohttp', 'scipy', 'pydantic'};"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or "
        "m.startswith('loadlab.') and m != 'loadlab._version'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.strip() == "[]"
    for name in loadlab.__all__:
        assert getattr(loadlab, name) is not None
    with pytest.raises(AttributeError):
        _ = loadlab.no_such_name  # type: ignore[attr-defined]


def test_read_results_to_dataframe_and_summarize(tmp_path: Path) -> None:
    path = loadlab.write_results(make_results(40, seed=3, failures=2), tmp_path / "r.json")
    results = loadlab.read_results(path)
    df = results.to_dataframe()
    assert len(df) == 40 and list(df["request_id"][:2]) == ["r0", "r1"]
    assert df["ttft_ms"].isna().sum() == 2  # the two failures have no first token
    summary = loadlab.summarize(results)
    assert summary.counts.ok == 38 and summary.counts.failed == 2


def test_evaluate_takes_a_spec_a_path_or_a_mapping() -> None:
    results = make_results(300, seed=0)
    path = ROOT / "examples" / "slo.toml"
    by_path = loadlab.evaluate(results, path)
    by_str = loadlab.evaluate(results, str(path))
    by_spec = loadlab.evaluate(results, load_slo(path))
    assert by_path.exit_code == by_str.exit_code == by_spec.exit_code
    assert [r.status for r in by_path.rows] == [r.status for r in by_spec.rows]
    assert loadlab.evaluate(results, {"objectives": ["ttft_ms.p50 <= 1000"]}).passed
    assert not loadlab.evaluate(results, {"objectives": ["ttft_ms.p50 <= 1"]}).passed
    with pytest.raises(SLOError, match="no objectives"):
        loadlab.evaluate(results, {})


def test_run_in_a_running_event_loop() -> None:
    async def main() -> loadlab.Results:
        async with FixedScheduleServer(ttft_ms=10, itl_ms=2, tokens=4) as srv:
            ep = loadlab.EndpointConfig(url=srv.url, name="fixed")
            cfg = loadlab.RunConfig(endpoints=(ep,), concurrency=2, requests=6, max_tokens=4)
            return await loadlab.run(cfg)

    results = asyncio.run(main())
    assert [r.outcome for r in results.records] == ["ok"] * 6
    assert {r.endpoint for r in results.records} == {"fixed"}


def test_run_refuses_what_it_cannot_do() -> None:
    a = loadlab.EndpointConfig(url="http://127.0.0.1:9", name="a")
    b = loadlab.EndpointConfig(url="http://127.0.0.1:9", name="b")
    two = loadlab.RunConfig(endpoints=(a, b), concurrency=1, requests=1)
    with pytest.raises(ConfigError, match="2 endpoints"):
        loadlab.run_sync(two)
    with pytest.raises(ConfigError, match="no endpoint named 'c'"):
        loadlab.run_sync(two, endpoint="c")
    with pytest.raises(ConfigError, match="workers > 1 use run_sync"):
        asyncio.run(loadlab.run(two.replace(workers=2, concurrency=2), endpoint="a"))
