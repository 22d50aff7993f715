"""Start the reference server as a subprocess on a free loopback port (tests, benchmarks, lab).

Usage::

    with start_server(mode="continuous", preset="tiny") as server:
        print(server.url)       # http://127.0.0.1:<port>, /health already answers
    with start_server(config=ServerConfig(mode="chunked", preset="tiny", chunk_size=16)) as s:
        ...                     # every flag from a config (its host and port are replaced)
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
from dataclasses import replace
from pathlib import Path

from reference_server.config import ServerConfig

__all__ = ["RunningServer", "free_port", "start_server"]

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RunningServer:
    """A reference server subprocess: ``RunningServer(...)`` starts it, ``wait_ready`` waits
    for ``/health``, ``stop`` ends it (SIGTERM, then SIGKILL after ``grace_s``).

    Start several first and then wait for each, so their start-up (importing torch) overlaps.
    """

    def __init__(
        self,
        mode: str = "continuous",
        preset: str = "cpu",
        port: int | None = None,
        extra_args: Sequence[str] = (),
        log_path: str | Path | None = None,
        api_key: str | None = None,
        env: dict[str, str] | None = None,
        config: ServerConfig | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path) if log_path else None
        self.api_key = api_key
        base = config or ServerConfig(mode=mode, preset=preset)
        flags = replace(base, host="127.0.0.1", port=self.port).to_argv()
        cmd = [sys.executable, "-m", "reference_server.cli", *flags, *extra_args]
        child_env = {**os.environ, **(env or {})}
        paths = [str(ROOT), child_env.get("PYTHONPATH", "")]
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        self._log = open(self.log_path, "wb") if self.log_path else None
        out = self._log if self._log else subprocess.DEVNULL
        self.process = subprocess.Popen(  # noqa: S603 (our own interpreter and module)
            cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env, cwd=ROOT
        )

    def wait_ready(self, timeout_s: float = 120.0) -> RunningServer:
        _wait_healthy(self.process, self.url, timeout_s, self.api_key, self.log_path)
        return self

    def stop(self, grace_s: float = 10.0) -> None:
        proc = self.process
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None


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
    config: ServerConfig | None = None,
) -> Iterator[RunningServer]:
    """Run ``python3 -m reference_server.cli`` until the block exits; waits for ``/health``.

    ``config`` replaces ``mode``, ``preset`` and the flags ``extra_args`` would otherwise have
    to spell (``extra_args`` still go after it). ``api_key`` is only sent to ``/health`` (pass the key to the server through ``env`` and
    ``--api-key-env``). The process gets SIGTERM on exit and SIGKILL if still alive after 10 s.
    """
    server = RunningServer(mode, preset, port, extra_args, log_path, api_key, env, config)
    try:
        yield server.wait_ready(timeout_s)
    finally:
        server.stop()


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
