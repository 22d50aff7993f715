"""Predict latency by simulation: the reference server's scheduling replayed on a step-time model.

Modules::

    policies.py   static, continuous, chunked scheduling on counters (reference_server/scheduler/)
    steptime.py   step-time models: roofline (GPU presets, this machine), linear (fitted), by role
    engine.py     the discrete-event loop, driven by the runner's workload objects
    output.py     a simulation as a normal results file, marked predicted

Example::

    from loadlab.simulate import ServerConfig, Simulator, LinearStepTime
    out = Simulator(cfg, ServerConfig(mode="continuous"), LinearStepTime(0.02, 1e-4)).run(specs)
    write_results(out.to_results(), "reports/predicted.json")
"""

from __future__ import annotations

from loadlab.simulate._engine import SimOutput, Simulator, simulate
from loadlab.simulate._output import is_predicted, to_results
from loadlab.simulate._server import MODES, ServerConfig
from loadlab.simulate._steptime import (
    LinearStepTime,
    RoleStepTime,
    RooflineStepTime,
    StepTimeModel,
)

__all__ = [
    "MODES",
    "LinearStepTime",
    "RoleStepTime",
    "RooflineStepTime",
    "ServerConfig",
    "SimOutput",
    "Simulator",
    "StepTimeModel",
    "is_predicted",
    "simulate",
    "to_results",
]
