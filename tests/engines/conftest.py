"""One vLLM for the whole engine-test session, started on 127.0.0.1 and stopped by PID.

The tests need ``LOADLAB_VLLM_PYTHON`` (vLLM's virtualenv interpreter) and
``LOADLAB_TINY_MODEL`` (the tiny model's folder); ``bash scripts/engines/vllm.sh`` makes both
and runs these tests. Without them every test here is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.vllm_server import SERVED_MODEL, VllmServer, engine_env_missing

ROOT = Path(__file__).resolve().parents[2]
# vLLM's start on a loaded 2-core machine took 106-150 s; the bound leaves room for worse.
START_TIMEOUT_S = 420.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    missing = engine_env_missing()
    if missing and os.environ.get("LOADLAB_VLLM_URL") and os.environ.get("LOADLAB_TINY_MODEL"):
        missing = None
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.engine)
            if missing:
                item.add_marker(pytest.mark.skip(reason=missing))


@dataclass(frozen=True)
class Engine:
    url: str  # http://127.0.0.1:PORT
    model: str  # the served model name


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The session's vLLM; ``LOADLAB_VLLM_URL`` names one already running instead (started
    with the flags below and ``--served-model-name tiny``), which saves its start while
    developing these tests."""
    if url := os.environ.get("LOADLAB_VLLM_URL"):
        yield Engine(url.rstrip("/"), SERVED_MODEL)
        return
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    # -O0: no torch.compile warm-up (about 40 s of the start here); prompt-token details: the
    # Anthropic endpoint then splits prefix-cache hits out of input_tokens, as Anthropic does.
    server = VllmServer.from_env(log_path=log, extra_args=["-O0", "--enable-prompt-tokens-details"])
    try:
        server.wait_ready(START_TIMEOUT_S)
        yield Engine(server.url, server.model)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return Path(os.environ["LOADLAB_TINY_MODEL"])


def loadlab_env() -> dict[str, str]:
    """The environment a ``python3 -m loadlab`` subprocess imports this checkout's loadlab in."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def loadlab_run(
    out: Path, args: Sequence[str], timeout_s: float = 240.0, expect_file: bool = True
) -> dict[str, Any]:
    """``python3 -m loadlab run ARGS --out OUT`` as a user types it; the results file's JSON
    (``{}`` where there is none and ``expect_file`` is false)."""
    env = loadlab_env()
    cmd = [sys.executable, "-m", "loadlab", "run", *args, "--out", str(out), "--no-progress"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    if expect_file:
        assert out.is_file(), (
            f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    data: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    data["_stdout"], data["_stderr"], data["_rc"] = proc.stdout, proc.stderr, proc.returncode
    return data
