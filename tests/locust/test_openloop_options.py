"""Locust's master and workers with loadlab's runner: bad options stop the master before any
worker is asked anything (exit 2, the flag named), and the Kubernetes example in
docs/distributed.md uses real flags."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from loadlab._commands.flags import add_run_arguments, config_from_args
from tests.helpers.loopback import ROOT, free_port

pytestmark = pytest.mark.locust


def _containers() -> dict[str, list[str]]:
    text = (ROOT / "docs" / "distributed.md").read_text()
    block = re.search(r"```yaml\n(apiVersion: apps/v1\n.*?)```", text, re.S)
    assert block, "no master/worker Deployments in docs/distributed.md"
    docs = [d for d in yaml.safe_load_all(block.group(1)) if d["kind"] == "Deployment"]
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["args"]
            for d in docs}  # fmt: skip


def test_the_kubernetes_example_uses_real_flags() -> None:
    args = _containers()
    master, worker = args["loadlab-master"], args["loadlab-worker"]
    run = master[master.index("--loadlab-run") + 1]
    p = argparse.ArgumentParser(exit_on_error=False)
    add_run_arguments(p)
    cfg = config_from_args(p.parse_args(shlex.split(run)))
    assert cfg.rate_rps == 400 and cfg.requests == 24000 and cfg.seed == 7
    help_text = subprocess.run(
        [sys.executable, "-m", "locust", "-f", "examples/locust_openloop.py", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    # Locust's --help leaves out a locustfile's options: loadlab's are read from their source
    source = (ROOT / "loadlab" / "locust" / "_openloop.py").read_text()
    ours = set(re.findall(r'add_argument\("(--loadlab-[a-z-]+)"', source))
    flags = {a for a in [*master, *worker] if a.startswith("-") and " " not in a}
    unknown = {f for f in flags if f not in ours and f not in help_text}
    assert {"--loadlab-run", "--loadlab-out"} <= flags and not unknown, unknown
    assert worker[worker.index("--master-host") + 1] == "loadlab-master"


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ([], "give the run: --loadlab-run"),
        (["--loadlab-run", "--endpoint http://127.0.0.1:9 --rate 1 --requests 1 --out x.json"],
         "leave out --out; the master sets it per worker"),
        (["--loadlab-run", "--rate 1 --requests 1"], "give one --endpoint URL"),
        (["--loadlab-run", "--endpoint http://127.0.0.1:9 --rate 1", "--loadlab-lead", "-1"],
         "--loadlab-lead must be > 0"),
        (["--loadlab-run", "--endpoint http://127.0.0.1:9 --rate x"], "--rate: invalid"),
    ],
)  # fmt: skip
def test_bad_options_stop_the_master(options: list[str], said: str, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "locust", "-f", "examples/locust_openloop.py", "--master",
           "--headless", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(free_port()),
           "--loadlab-out", str(tmp_path / "run.json"), *options]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and said in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "run.json").exists()
