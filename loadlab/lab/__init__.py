"""``loadlab lab``: the reference server's modes side by side, on the same seeded workload.

The data flows settings → experiments → summary → render::

    settings      LabSettings: every knob, one preset each (cpu, tiny, 1b)
    experiments   start a server per mode, run the three experiments, write results files
    batching      decode and prefill tokens/s against batch size (a subprocess: torch)
    summary       the results as plain data (lab.json), each number under its claim
    render        that data as Markdown and HTML tables

Example::

    s = settings_for("tiny")
    outcome = run_lab(s, ["continuous", "chunked"], Path("reports/lab"))
    print(render_markdown(lab_summary(outcome, s)))

``batching`` is not imported here: ``loadlab lab`` runs it as ``python3 -m
loadlab.lab.batching``, and importing it from the package first would make Python warn.
"""

from __future__ import annotations

from loadlab.lab.experiments import EXPERIMENTS, LabOutcome, available_modes, run_lab
from loadlab.lab.render import render_html, render_markdown
from loadlab.lab.settings import ALL_MODES, LabSettings, settings_for
from loadlab.lab.summary import lab_summary

__all__ = [
    "ALL_MODES",
    "EXPERIMENTS",
    "LabOutcome",
    "LabSettings",
    "available_modes",
    "lab_summary",
    "render_html",
    "render_markdown",
    "run_lab",
    "settings_for",
]
