"""``loadlab.locust`` imports Locust (and so gevent's monkey-patching) only when ``LLMUser`` or
another name of ``user`` is asked for: the pure modules stay importable in the test process.
Each check runs in a fresh interpreter, whose ``sys.modules`` this process cannot pollute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.helpers.loopback import ROOT


def _fresh(code: str) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pure_modules_never_import_locust_or_gevent() -> None:
    loaded = _fresh(
        "import json, sys\n"
        "import loadlab.locust, loadlab.locust._collect, loadlab.locust._options\n"
        "print(json.dumps(sorted(m for m in ('gevent', 'locust') if m in sys.modules)))\n"
    )
    assert loaded == []


def test_llmuser_is_imported_on_demand() -> None:
    out = _fresh(
        "import json, sys\n"
        "from loadlab.locust import LLMUser, workload_specs\n"
        "import loadlab.locust, loadlab.locust._user as user\n"
        "try:\n"
        "    loadlab.locust.no_such_name\n"
        "    missing = 'no error'\n"
        "except AttributeError as exc:\n"
        "    missing = str(exc)\n"
        "print(json.dumps({'same': LLMUser is user.LLMUser and workload_specs is user.workload_specs,\n"
        "    'locust': 'locust' in sys.modules, 'missing': missing}))\n"
    )
    assert out["same"] is True and out["locust"] is True
    assert out["missing"] == "module 'loadlab.locust' has no attribute 'no_such_name'"
