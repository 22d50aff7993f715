"""The harness alone (no torch, no Locust): every command that needs an extra says which one
to install and exits 2 before it does anything. The missing packages are
hidden from a real child process by a meta-path finder, as if never installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.loopback import ROOT

HIDE = """
import importlib.abc, importlib.util, sys
HIDDEN = {"torch", "fastapi", "uvicorn", "locust"}
class Hide(importlib.abc.MetaPathFinder):  # an import of them fails as if not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
_find_spec = importlib.util.find_spec
def find_spec(name, package=None):  # and a look-up finds nothing, as if not installed
    return None if name.split(".")[0] in HIDDEN else _find_spec(name, package)
importlib.util.find_spec = find_spec
"""


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", HIDE + code], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--requests", "2", "--concurrency", "1"],
        ["lab", "--quick"],
        ["sweep", "--slo", str(ROOT / "examples" / "slo.toml"), "--concurrencies", "1,2"],
        ["capacity", "--vs-measured"],
    ],
)
def test_a_command_needing_the_server_says_which_extra_and_exits_2(
    argv: list[str], tmp_path: Path
) -> None:
    done = _run(f"from loadlab.cli import main; sys.exit(main({argv!r}))", tmp_path)
    assert done.returncode == 2, done.stderr
    assert (
        "needs the 'server' extra" in done.stderr
        and 'pip install torch==2.13.0 "loadlab[server]"' in done.stderr
    )
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").iterdir())


def test_loadlab_server_says_which_extra_and_exits_2(tmp_path: Path) -> None:
    done = _run(
        "import runpy; runpy.run_module('reference_server.cli', run_name='__main__')", tmp_path
    )
    assert done.returncode == 2, done.stderr
    assert "loadlab-server: needs the 'server' extra" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_harness_alone_still_runs_offline_commands(tmp_path: Path) -> None:
    data = ROOT / "tests" / "data" / "results_v1_run.json"
    done = _run(
        f"from loadlab.cli import main; sys.exit(main(['report', {str(data)!r}]))", tmp_path
    )
    assert done.returncode == 0, done.stderr


def test_the_locust_user_says_which_extra(tmp_path: Path) -> None:
    code = (
        "from loadlab.errors import MissingExtraError\n"
        "try:\n    from loadlab.locust import LLMUser\n"
        "except MissingExtraError as exc:\n    print(exc); sys.exit(2)"
    )
    done = _run(code, tmp_path)
    assert done.returncode == 2 and 'pip install "loadlab[locust]"' in done.stdout, done.stderr
