"""The machine watch, histogram quantiles, busy reasons and the placement plan."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from loadlab._lab.machine import (
    MachineWatch,
    busy_reasons,
    histogram_quantile,
    placement_report,
    plan_placement,
    step_jitter,
)

INF = float("inf")
ROWS = [(0.01, 0), (0.02, 50), (0.04, 90), (INF, 100)]  # (upper bound s, steps at or under)


def _buckets(metric: str, phase: str, rows: list[tuple[float, int]]) -> dict[str, float]:
    """A histogram's ``(le, count)`` rows as the server's bucket counters by name."""
    return {f'{metric}_bucket{{phase="{phase}",le="{"+Inf" if le == INF else le}"}}': float(n)
            for le, n in rows}  # fmt: skip


def test_histogram_quantile_interpolates_inside_a_bucket() -> None:
    assert histogram_quantile(ROWS, 0.5) == pytest.approx(0.02)
    assert histogram_quantile(ROWS, 0.25) == pytest.approx(0.015)
    assert histogram_quantile(ROWS, 0.7) == pytest.approx(0.03)
    assert histogram_quantile(ROWS, 0.95) == pytest.approx(0.04)  # in +Inf: its lower bound
    assert histogram_quantile([(1.0, 0)], 0.5) is None


def test_step_jitter_from_counter_deltas() -> None:
    prefill = _buckets("x_step_seconds", "prefill", [(0.01, 7)])  # not counted: decode only
    d = _buckets("x_step_seconds", "decode", ROWS) | prefill
    assert d['x_step_seconds_bucket{phase="decode",le="+Inf"}'] == 100.0
    j = step_jitter(d)
    assert j["p50_s"] == pytest.approx(0.02) and j["ratio"] == pytest.approx(0.04 / 0.02)
    # every step inside the first bucket: the jitter cannot be read
    first = _buckets("s_step_seconds", "decode", [(0.001, 9)])
    assert step_jitter(first)["ratio"] is None


def test_busy_reasons() -> None:
    assert busy_reasons({"others_cores": 0.1, "own_cores": 1.8, "steal_share": 0.0}, 2) == []
    assert busy_reasons({"others_cores": 0.6, "own_cores": 1.8, "steal_share": 0.1}, 2) == [
        "other processes took 0.60 cores",
        "steal 10%",
    ]
    # 16 cores: two busy neighbours leave the lab's cores free
    assert busy_reasons({"others_cores": 2.0, "own_cores": 2.0, "steal_share": 0.0}, 16) == []
    assert busy_reasons({}, 2, jitter=2.0) == ["server decode steps p90/p50 2.00"]


def test_plan_placement() -> None:
    two = plan_placement([1, 0])
    assert (two.generator, two.server, two.prefill, two.decode) == ((0,), (1,), (0,), (1,))
    four = plan_placement([0, 1, 2, 3], threads=2)
    assert four.server == (1, 2) and four.prefill == (1,) and four.decode == (2, 3)
    assert plan_placement([0]).server == ()


@pytest.mark.timeout(30)
def test_watch_counts_the_labs_own_children_as_its_own() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    watch = MachineWatch.start()
    child = subprocess.Popen([sys.executable, "-c", burn + "\nimport time; time.sleep(2)"])
    try:
        p = psutil.Process(child.pid)
        while sum(p.cpu_times()[:2]) < 0.3:  # however busy the machine, it gets there
            pass
        spent = sum(p.cpu_times()[:2])
        load = watch.stop()
        assert load["own_cores"] * load["wall_s"] >= 0.9 * spent
        assert load["others_cores"] >= 0.0 and 0.0 <= load["steal_share"] <= 1.0
        assert placement_report({"child": child.pid})["child"]
    finally:
        child.kill()
        child.wait()
