"""docs/distributed.md's Kubernetes example for Locust's master and workers uses real flags."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from loadlab.commands.flags import add_run_arguments, config_from_args
from tests.helpers.loopback import ROOT

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
    source = (ROOT / "loadlab" / "locust" / "openloop.py").read_text()
    ours = set(re.findall(r'add_argument\("(--loadlab-[a-z-]+)"', source))
    flags = {a for a in [*master, *worker] if a.startswith("-") and " " not in a}
    unknown = {f for f in flags if f not in ours and f not in help_text}
    assert {"--loadlab-run", "--loadlab-out"} <= flags and not unknown, unknown
    assert worker[worker.index("--master-host") + 1] == "loadlab-master"
