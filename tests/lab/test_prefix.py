"""The lab's prefix-cache experiment on the tiny preset: every point ran, and the server's
counters agree with the hit rate each workload expects from its own prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadlab._lab.prefix import hit_rate_workload, prefix_lab, prefix_settings

pytest.importorskip("reference_server.launch")


@pytest.mark.parametrize("target", [0.5, 0.9])
def test_hit_rate_workload_lands_within_half_a_block_of_its_target(target: float) -> None:
    wl = hit_rate_workload(target, 1024, 60)
    per, n = wl["requests_per_prefix"], wl["prefix_tokens"]
    assert wl["prefixes"] * per >= 60 and n % 16 == 0 and n + wl["suffix_tokens"] == 1024
    assert abs((per - 1) / per * n / 1024 - target) < 16 / 1024


@pytest.mark.slow
def test_quick_prefix_lab(tmp_path: Path) -> None:
    data = prefix_lab(prefix_settings(quick=True), tmp_path, log=lambda _: None)
    assert len(data["ttft"]) == 2 * 3 and len(data["throughput"]) == 3
    for row in data["ttft"] + data["throughput"]:
        assert row["failed"] == 0
        if row.get("caching") != "off":
            assert abs(row["server_hit_rate"] - row["expected_hit_rate"]) <= 0.02
        else:  # caching off: the server caches nothing
            assert row["server_hit_rate"] == 0
    assert [round(r["expected_hit_rate"], 1) for r in data["throughput"]] == [0.0, 0.5, 0.9]
    text = (tmp_path / "prefix.md").read_text(encoding="utf-8")
    assert "TTFT against prefix length" in text and "| 90% |" in text
