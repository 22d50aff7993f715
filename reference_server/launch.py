"""Start the reference server as a subprocess on a free loopback port (tests, benchmarks, lab).

Usage::

    with start_server(mode="continuous", preset="tiny") as server:
        print(server.url)       # http://127.0.0.1:<port>, /health already answers
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunningServer", "free_port", "start_server"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class RunningServer:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path | None


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def start_server(
    mode: str = "continuous",
    preset: str = "cpu",
    port: int | None = None,
    extra_args: Sequence[str] = (),
    timeout_s: float = 120.0,
    log_path: str | Path | None = None,
    api_key: str | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[RunningServer]:
    """Run ``python3 -m reference_server.cli`` until the block exits; waits for ``/health``.

    The process is sent SIGTERM on exit and killed if it has not stopped within 10 s.
    """
    port = port or free_port()
    cmd = [sys.executable, "-m", "reference_server.cli", "--mode", mode, "--preset", preset,
           "--port", str(port), "--host", "127.0.0.1", *extra_args]  # fmt: skip
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), child_env.get("PYTHONPATH")])
    )
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=ROOT)  # noqa: S603
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url, timeout_s, api_key, log_path)
        yield RunningServer(url, port, proc, Path(log_path) if log_path else None)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if log is not subprocess.DEVNULL:
            log.close()


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout_s: float,
                  api_key: str | None, log_path: str | Path | None) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout_s
    req = urllib.request.Request(url + "/health")  # noqa: S310 (http://127.0.0.1 built above)
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            where = f"; see {log_path}" if log_path else "; pass log_path= to see why"
            raise RuntimeError(f"reference server exited with code {proc.returncode}{where}")
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:  # noqa: S310 (loopback URL we built)
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"reference server at {url} not healthy after {timeout_s:.0f} s")
