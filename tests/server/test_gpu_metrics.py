"""The reference server's GPU lines on ``/metrics``: none on CPU; on CUDA, the GPU it runs on
under the names loadlab's GPU telemetry reads (torch.cuda stood in for here: no GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loadlab._analysis.server_metrics import parse_prometheus_text
from loadlab._analysis.telemetry import gpu_series
from reference_server import metrics

torch = pytest.importorskip("torch")


def test_no_gpu_lines_on_cpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert metrics.gpu_lines() == []


def test_on_cuda_the_page_describes_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.cuda
    props = SimpleNamespace(uuid="58b4b8e4-1c2d-4e5f-8a9b-0c1d2e3f4a5b", name="NVIDIA H200")
    for name, value in {
        "is_available": lambda: True,
        "current_device": lambda: 0,
        "get_device_properties": lambda i: props,
        "utilization": lambda i: 87,
        "mem_get_info": lambda i: (100 * 2**30, 141 * 2**30),  # (free, total)
        "power_draw": lambda i: 512_250,  # mW
        "clock_rate": lambda i: 1980,  # MHz
        "temperature": lambda i: 61,
    }.items():
        monkeypatch.setattr(cuda, name, value, raising=False)
    monkeypatch.setattr(metrics, "_nvml_energy_j", lambda uuid: 4.5e6)
    text = "\n".join(metrics.gpu_lines()) + "\n"
    assert "# TYPE loadlab_gpu_energy_joules_total counter" in text
    [g] = gpu_series([{"t_ns": 0, "metrics": parse_prometheus_text(text)}])
    assert (g["gpu"], g["model"], g["uuid"]) == ("0", "NVIDIA H200", f"GPU-{props.uuid}")
    assert g["gpu_util_pct"] == [87.0] and g["memory_used_mib"] == [41 * 1024.0]
    assert g["power_w"] == [512.25] and g["sm_clock_mhz"] == [1980.0]
    assert g["temperature_c"] == [61.0] and g["energy_j"] == [4.5e6]
    # a reading the driver refuses (no pynvml for utilisation) is left out, not made up
    monkeypatch.setattr(
        cuda, "utilization", lambda i: (_ for _ in ()).throw(ModuleNotFoundError("pynvml"))
    )
    assert "utilization_percent" not in "\n".join(metrics.gpu_lines())
