"""``loadlab lab``: the reference server's modes side by side, on the same seeded workload.

The data flows settings → experiments → summary → claims → render::

    settings      LabSettings: every knob, one preset each (cpu, tiny, 1b)
    experiments   start a server per mode, run the experiments in rounds, write results files
    batching      decode and prefill step times against batch size (a subprocess: torch)
    machine       what else the machine did during each measurement; where each process runs
    stalls        longest stall per stream in flight while a long prompt is prefilled
    batchjob      the batch job's Azure answer lengths, E[max]/mean, both schedules replayed
    figures       a figure over rounds: the median, its spread, the busy rounds
    summary       the results as plain data (lab.json): per round, and figures over rounds
    claims        each of the lesson's claims: shown, or not shown on this machine and why
    render        that data as Markdown and HTML tables

Example::

    s = settings_for("tiny")
    outcome = run_lab(s, ["continuous", "chunked"], Path("reports/lab"))
    print(render_markdown(lab_summary(outcome, s)))

``batching`` is not imported here: ``loadlab lab`` runs it as ``python3 -m
loadlab._lab.batching``, and importing it from the package first would make Python warn.
"""

from __future__ import annotations

from loadlab._lab.experiments import EXPERIMENTS, LabOutcome, available_modes, run_lab
from loadlab._lab.render import render_html, render_markdown
from loadlab._lab.settings import ALL_MODES, LabSettings, settings_for
from loadlab._lab.summary import lab_summary

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
