"""The lab's settings: presets, overrides and what they refuse."""

from __future__ import annotations

import pytest

from loadlab._lab.machine import plan_placement
from loadlab._lab.settings import LabSettings, settings_for


def test_settings_validate() -> None:
    with pytest.raises(ValueError, match="raise --duration"):
        LabSettings(preset="cpu", duration_s=3.0, long_first_s=5.0)
    with pytest.raises(ValueError, match="rounds"):
        LabSettings(preset="cpu", rounds=0)
    with pytest.raises(ValueError, match="--preset"):
        settings_for("huge")
    s = settings_for("cpu", duration_s=80.0, chunk_size=None)
    assert s.duration_s == 80.0 and s.chunk_size == 64
    assert s.long_prompts == 23  # at 1.5, 5, 8.5, ..., 78.5 s
    assert "--chunk-size" in s.server_args("chunked") and "--threads" in s.server_args("static")
    assert "--chunk-size" not in s.server_args("continuous")
    pools = s.server_args("disaggregated", plan_placement([0, 1]))
    assert pools[-4:] == ["--prefill-cpus", "0", "--decode-cpus", "1"]
    assert "--prefill-cpus" not in s.server_args("disaggregated", plan_placement([0]))


def test_each_gpu_server_gets_its_own_kv_budget() -> None:
    # The four modes' servers share one GPU: a default cache (most of what is free) would
    # leave the later ones nothing.
    gpu = settings_for("1b")
    for mode in ("static", "chunked", "disaggregated"):
        args = gpu.server_args(mode)
        assert args[args.index("--kv-cache-mb") + 1] == "8192"
    assert "--kv-cache-mb" not in settings_for("cpu").server_args("static")
