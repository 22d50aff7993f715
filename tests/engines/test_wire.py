"""``loadlab selftest --wire`` against vLLM's CPU build, at concurrency 1 and 8: every
request found on the wire and read the same way (the same token events), and the wire's
times in causal order with loadlab's (loadlab stamps ``sent`` before its bytes leave and reads
each token after it arrived). The error's size is the benchmark's
(``benchmarks/vs_vllm_bench.py``): on a loaded 2-core machine vLLM's threads can keep loadlab
from its socket for tens of milliseconds, which the wire shows and loadlab flags as saturated;
here the bound on the median error holds only when loadlab did not flag itself.

Needs root or CAP_NET_RAW besides the engine; skipped without, saying so.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engines.conftest import ROOT, Engine
from tests.helpers.vllm_bench import text_token_ids
from tests.helpers.wire import needs_capture

pytestmark = needs_capture


@pytest.mark.parametrize("concurrency", [1, 8])
def test_selftest_wire_on_vllm(
    vllm: Engine, tiny_model: Path, tmp_path: Path, concurrency: int
) -> None:
    out = tmp_path / "r.json"
    requests = 4 * concurrency if concurrency > 1 else 8
    # 24 tokens, each with text (tests/helpers/vllm_bench.py says why)
    extra = {"ignore_eos": True, "allowed_token_ids": text_token_ids(tiny_model)}
    cmd = [
        sys.executable, "-m", "loadlab", "selftest", "--wire", "--endpoint", vllm.url,
        "--model", vllm.model, "--concurrency", str(concurrency), "--requests", str(requests),
        "--prompt-tokens", "64", "--max-tokens", "24", "--tolerance-ms", "1000,1000,1000",
        "--extra-body", json.dumps(extra), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    wire = data["extra"]["wire"]
    fig = wire["figures"]
    assert (fig["joined"], fig["requests"], fig["mismatched"]) == (requests, requests, 0)
    assert wire["capture"]["dropped"] == 0
    errors = []
    for r in data["records"]:
        t = wire["truth"][r["request_id"]]
        assert len(t["chunk_ns"]) == len(r["chunk_ns"]) >= 1  # vLLM may merge tokens
        assert r["sent_ns"] <= t["sent_ns"] + 100_000  # 0.1 ms: the clock offset's margin
        assert all(w <= c + 100_000 for w, c in zip(t["chunk_ns"], r["chunk_ns"], strict=True))
        errors.append((r["chunk_ns"][0] - r["sent_ns"] - t["chunk_ns"][0] + t["sent_ns"]) / 1e6)
    if not data["generator"]["saturated"]:
        assert statistics.median(errors) < 20.0, errors
