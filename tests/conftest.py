"""Shared test helpers. Servers that tests need are started here or in a folder's conftest,
always on 127.0.0.1 and bounded in time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.loopback import ROOT, free_port

__all__ = ["ROOT", "SHARED_DATA", "free_port"]  # tests that still import them from here

SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA
