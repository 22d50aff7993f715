"""Locust runs in its own processes (it monkey-patches the interpreter with gevent): these
helpers start ``locust`` subprocesses bounded in time and always killed, and talk to the
fixed-schedule server they stream from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.helpers.loopback import ROOT

__all__ = ["LOCUSTFILE", "finish", "get_json", "locust_cmd", "post", "spawn"]

LOCUSTFILE = str(ROOT / "tests" / "locust" / "locustfile_fixed.py")


def locust_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", LOCUSTFILE, *args]


def spawn(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """A locust process writing its console to ``log``; PYTHONPATH finds this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    fh = log.open("wb")
    try:
        return subprocess.Popen(list(args), cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
    finally:
        fh.close()  # the child holds its own copy


def finish(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    """Wait for the first process (up to ``timeout_s``), then the rest (they follow it out
    within 20 s); kill all of them if any overstays."""
    codes = []
    try:
        for i, p in enumerate(procs):
            codes.append(p.wait(timeout=timeout_s if i == 0 else 20))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return codes


def get_json(url: str, timeout_s: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (loopback)
        return json.loads(resp.read())


def post(url: str) -> None:
    req = urllib.request.Request(url, data=b"", method="POST")  # noqa: S310 (loopback)
    with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 (loopback)
        resp.read()
