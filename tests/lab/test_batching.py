"""The batching experiment's pure part (the measurement itself runs in test_lab_e2e)."""

from __future__ import annotations

from loadlab._lab.batching import speedups


def test_speedups() -> None:
    assert speedups({4: 30.0, 1: 10.0, 16: 80.0}) == {1: 1.0, 4: 3.0, 16: 8.0}
