"""The >>> examples of ``loadlab.locust._user``, run in their own process: the suite's
--doctest-modules must not import it (gevent would monkey-patch the test process; the root
conftest.py leaves it out)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.locust


def test_the_examples_of_the_locust_user_module_hold() -> None:
    code = (
        "import doctest, sys, loadlab.locust._user as m; r = doctest.testmod(m); "
        "print(r.attempted, r.failed); sys.exit(1 if r.failed or not r.attempted else 0)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
