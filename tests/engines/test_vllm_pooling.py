"""loadlab's embeddings and rerank loads against vLLM's CPU build serving two tiny BERT models
made on the spot (``scripts/engines/make_tiny_model.py``): a ``BertModel`` on
``/v1/embeddings`` and a one-label ``BertForSequenceClassification`` (a cross-encoder) on
``/v1/rerank`` and ``/score``. Both servers start together, once for this module.

Needs ``LOADLAB_TINY_EMBEDDER`` and ``LOADLAB_TINY_RERANKER`` (the two model folders) besides
``LOADLAB_VLLM_PYTHON``; ``bash scripts/engines/vllm.sh`` makes and exports them all.

Token counts: the model's tokenizer frames every text as ``[CLS] text [SEP]`` and every (query,
document) pair as ``[CLS] query [SEP] document [SEP]``; vLLM's ``usage.prompt_tokens`` counts
those special tokens, and so does every record. loadlab does not fit embedding inputs to a
tokenizer: each input is drafted at the tokenizer's characters per token, so an embeddings
record's ``prompt_tokens_requested`` (the inputs' requested lengths, summed) is an estimate
and its ``prompt_tokens`` (the server's count) is the truth the tests check against the
tokenizer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadlab._runner.prompt_sizing import size_prompts
from loadlab.config import EndpointConfig, RunConfig
from loadlab.records import RequestSpec
from loadlab.results import read_results
from loadlab.workloads import build_requests
from tests.engines.conftest import ROOT, START_TIMEOUT_S, Engine, loadlab_env, loadlab_run
from tests.helpers.vllm_server import ENV_PYTHON, SERVED_MODEL, VllmServer

ENV_EMBEDDER, ENV_RERANKER = "LOADLAB_TINY_EMBEDDER", "LOADLAB_TINY_RERANKER"
_DIRS = {name: os.environ.get(name, "") for name in (ENV_EMBEDDER, ENV_RERANKER)}
pytestmark = pytest.mark.skipif(
    not all(d and (Path(d) / "config.json").is_file() for d in _DIRS.values()),
    reason=f"no tiny pooling models: {ENV_EMBEDDER} and {ENV_RERANKER} do not name model "
    "folders (bash scripts/engines/vllm.sh makes both and runs these tests)",
)
REQUESTS = 8


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Engine]]:
    """vLLM serving the embedder and vLLM serving the reranker, started at once;
    ``LOADLAB_VLLM_EMBED_URL`` and ``LOADLAB_VLLM_RERANK_URL`` name two already running instead
    (started with ``--max-model-len 512 --served-model-name tiny``), which saves their starts
    while developing these tests."""
    urls = {k: os.environ.get(f"LOADLAB_VLLM_{k.upper()}_URL") for k in ("embed", "rerank")}
    if all(urls.values()):
        yield {k: Engine(str(u).rstrip("/"), SERVED_MODEL) for k, u in urls.items()}
        return
    logs = tmp_path_factory.mktemp("vllm-pooling")
    servers: dict[str, VllmServer] = {}
    try:
        for kind, env in (("embed", ENV_EMBEDDER), ("rerank", ENV_RERANKER)):
            servers[kind] = VllmServer(os.environ[ENV_PYTHON], _DIRS[env], max_model_len=512,
                                       extra_args=["-O0"], log_path=logs / f"{kind}.log")  # fmt: skip
        for server in servers.values():
            server.wait_ready(START_TIMEOUT_S)
        yield {k: Engine(s.url, s.model) for k, s in servers.items()}
    finally:
        for server in servers.values():
            server.stop()


def _tokenizer(env: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(_DIRS[env]) / "tokenizer.json"))


def _run(engine: Engine, tmp: Path, api: str, workload: str, name: str) -> tuple[Path, dict]:
    scenario = tmp / f"{name}.toml"
    scenario.write_text(f"workload = {workload}\n")
    out = tmp / f"{name}.json"
    env = ENV_EMBEDDER if api == "embeddings" else ENV_RERANKER
    run = loadlab_run(out, ["--endpoint", engine.url, "--model", engine.model, "--api", api,
                            "--scenario", str(scenario), "--concurrency", "4",
                            "--requests", str(REQUESTS), "--tokenizer", _DIRS[env]])  # fmt: skip
    assert run["_rc"] == 0, run["_stderr"][-2000:]
    return out, run


def _sent(out: Path, api: str, tokenizer: str) -> dict[str, RequestSpec]:
    """The requests the run sent, built again from its own workload, seed and tokenizer (the
    results file keeps no texts; the tokenizer's characters per token draft the inputs)."""
    config = read_results(out).config
    cfg = RunConfig(endpoints=(EndpointConfig("http://127.0.0.1:9", api=api),),
                    concurrency=4, requests=REQUESTS, seed=config["seed"],
                    workload=config["workload"], tokenizer=tokenizer)  # fmt: skip
    sizing = size_prompts(cfg, cfg.endpoints[0])
    return {s.request_id: s for s in build_requests(cfg, sizing, read_ahead=0)}


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)  # noqa: S310 - loopback
    with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - loopback URL
        answer: dict[str, Any] = json.load(resp)
    return answer


def test_embeddings_input_counts_are_the_servers_and_the_tokenizers(
    engines: dict[str, Engine], tmp_path: Path
) -> None:
    """Batches of 4 inputs: every record ok, 4 inputs, prompt_tokens equal to vLLM's usage for
    the same batch and to the tokenizer's count with [CLS] and [SEP] (2 per input)."""
    engine = engines["embed"]
    out, _ = _run(engine, tmp_path, "embeddings",
                  '{kind = "embeddings", batch_size = 4, input_tokens = 40}', "a")  # fmt: skip
    recs = read_results(out).records
    assert len(recs) == REQUESTS and all(r.ok for r in recs), [r.error for r in recs]
    tok, sent = _tokenizer(ENV_EMBEDDER), _sent(out, "embeddings", _DIRS[ENV_EMBEDDER])
    for r in recs:
        texts = list(sent[r.request_id].inputs)
        assert r.inputs == len(texts) == 4
        counted = sum(len(tok.encode(t).ids) for t in texts)
        bare = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)
        assert r.prompt_tokens == counted == bare + 2 * 4, r.request_id
        assert r.prompt_tokens_requested == 4 * 40  # drafted, not fitted: see the docstring
        assert r.chunk_ns == [] and r.end_ns > r.sent_ns
    first = recs[0]
    answer = _post(engine.url + "/v1/embeddings",
                   {"model": SERVED_MODEL, "input": list(sent[first.request_id].inputs)})  # fmt: skip
    assert answer["usage"]["prompt_tokens"] == first.prompt_tokens
    assert len(answer["data"]) == 4 and len(answer["data"][0]["embedding"]) == 128


def test_compare_of_two_embedding_runs(engines: dict[str, Engine], tmp_path: Path) -> None:
    wl = '{kind = "embeddings", batch_size = 2, input_tokens = 24}'
    a, _ = _run(engines["embed"], tmp_path, "embeddings", wl, "a")
    b, _ = _run(engines["embed"], tmp_path, "embeddings", wl, "b")
    proc = subprocess.run([sys.executable, "-m", "loadlab", "compare", str(a), str(b)], cwd=ROOT,
                          env=loadlab_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "e2e_ms.p50" in proc.stdout and "ttft_ms" not in proc.stdout


@pytest.mark.parametrize(("api", "path"), [("rerank", "/v1/rerank"), ("score", "/score")])
def test_rerank_pair_counts_are_the_servers_and_the_tokenizers(
    engines: dict[str, Engine], tmp_path: Path, api: str, path: str
) -> None:
    """4 documents a request: each record's prompt_tokens is vLLM's usage, which counts each
    pair as the tokenizer frames it: [CLS] query [SEP] document [SEP]."""
    engine = engines["rerank"]
    wl = '{kind = "rerank", documents = 4, query_tokens = 8, document_tokens = 32}'
    out, _ = _run(engine, tmp_path, api, wl, api)
    recs = read_results(out).records
    assert len(recs) == REQUESTS and all(r.ok for r in recs), [r.error for r in recs]
    tok, sent = _tokenizer(ENV_RERANKER), _sent(out, api, _DIRS[ENV_RERANKER])
    for r in recs:
        spec = sent[r.request_id]
        assert r.inputs == len(spec.inputs) == 4 and r.prompt_tokens_requested is None
        pairs = sum(len(tok.encode(spec.prompt, d).ids) for d in spec.inputs)
        assert r.prompt_tokens == pairs, r.request_id
    spec = sent[recs[0].request_id]
    body: dict[str, Any] = {"model": SERVED_MODEL}
    if api == "rerank":
        body.update(query=spec.prompt, documents=list(spec.inputs))
    else:
        body.update(text_1=spec.prompt, text_2=list(spec.inputs))
    answer = _post(engine.url + path, body)
    assert answer["usage"].get("prompt_tokens", answer["usage"].get("total_tokens")) == (
        recs[0].prompt_tokens
    )
