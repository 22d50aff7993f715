"""The shipped scenarios run from a checkout that has no ``../shared`` beside it.

The package and the scenarios are copied into a temporary folder (no ``shared`` next to it, no
git history) and ``loadlab run --scenario scenarios/azure_conv.toml`` runs there against the
fixed-schedule server, with loadlab imported from the copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from loadlab.selftest._fixed_server import FixedServerProcess
from tests.conftest import ROOT


def test_azure_conv_scenario_runs_without_shared_data(tmp_path: Path) -> None:
    repo = tmp_path / "clone" / "loadlab"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "loadlab", repo / "loadlab", ignore=ignore)
    shutil.copytree(ROOT / "scenarios", repo / "scenarios", ignore=ignore)
    assert not (repo.parent / "shared").exists()
    out = repo / "r.json"
    env = {**os.environ, "PYTHONPATH": str(repo)}
    with FixedServerProcess(ttft_ms=5, itl_ms=1, tokens=4) as url:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "loadlab",
                "run",
                "--scenario",
                "scenarios/azure_conv.toml",
                "--endpoint",
                url,
                "--requests",
                "6",
                "--tokenizer",
                "none",
                "--no-progress",
                "--out",
                str(out),
            ],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert len(data["records"]) == 6 and all(r["outcome"] == "ok" for r in data["records"])
    trace = data["extra"]["workload"]["trace"]
    assert Path(trace["path"]).is_relative_to(repo / "loadlab" / "data" / "traces")
