"""Images in chat prompts against vLLM's CPU build serving a tiny BLIP-2 made on the spot
(``scripts/engines/make_tiny_model.py``: a 64-pixel ViT, a Q-Former of 8 queries, an OPT
language model; random weights, the locally trained tokenizer).

vLLM 0.32's BLIP-2 takes one image per prompt and puts 8 ``<image>`` tokens (the Q-Former's
queries) before the prompt, whatever the image's size. loadlab counts an image's tokens by
``patch`` and ``max_side``: a 512 x 256 image with ``patch = 16, max_side = 64`` is scaled to
64 x 32, 4 x 2 tiles, 8 tokens, the same as the model's. So with ``--tokenizer`` (text fitted
with the model's chat template) every record's requested count is the server's count exactly.

Needs ``LOADLAB_TINY_VLM`` (the model folder) besides ``LOADLAB_VLLM_PYTHON``;
``bash scripts/engines/vllm.sh`` makes and exports both.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab.results import read_results
from tests.engines.conftest import START_TIMEOUT_S, Engine, loadlab_run
from tests.helpers.vllm_server import ENV_PYTHON, SERVED_MODEL, VllmServer

ENV_VLM = "LOADLAB_TINY_VLM"
_DIR = os.environ.get(ENV_VLM, "")
pytestmark = pytest.mark.skipif(
    not (_DIR and (Path(_DIR) / "config.json").is_file()),
    reason=f"no tiny vision-language model: {ENV_VLM} does not name a model folder "
    "(bash scripts/engines/vllm.sh makes it and runs these tests)",
)


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """vLLM serving the tiny BLIP-2; ``LOADLAB_VLLM_VLM_URL`` names one already running instead
    (started with ``--served-model-name tiny``)."""
    if url := os.environ.get("LOADLAB_VLLM_VLM_URL"):
        yield Engine(url.rstrip("/"), SERVED_MODEL)
        return
    log = tmp_path_factory.mktemp("vllm-vlm") / "vllm.log"
    server = VllmServer(os.environ[ENV_PYTHON], _DIR, extra_args=["-O0"], log_path=log)
    try:
        server.wait_ready(START_TIMEOUT_S)
        yield Engine(server.url, server.model)
    finally:
        server.stop()


def _run(vlm: Engine, tmp: Path, text_tokens: int, images: str, requests: int) -> tuple[int, list]:
    """``loadlab run`` of a synthetic chat workload with ``images``: its exit code and records."""
    scenario = tmp / "vlm.toml"
    scenario.write_text(
        f'[workload]\nkind = "synthetic"\nprompt_tokens = {text_tokens}\noutput_tokens = 4\n'
        f"images = {images}\n"
    )
    out = tmp / "vlm.json"
    run = loadlab_run(out, ["--endpoint", vlm.url, "--model", vlm.model, "--api", "chat",
                            "--scenario", str(scenario), "--concurrency", "2",
                            "--requests", str(requests), "--tokenizer", _DIR])  # fmt: skip
    recs = read_results(out).records
    assert len(recs) == requests, run["_stderr"][-2000:]  # none lost
    return run["_rc"], recs


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_image_prompts_are_counted_as_the_server_counts_them(
    vlm: Engine, tmp_path: Path, fmt: str
) -> None:
    images = (
        f'{{ count = 1, width = 512, height = 256, format = "{fmt}", patch = 16, max_side = 64 }}'
    )
    rc, recs = _run(vlm, tmp_path, 48, images, 8)
    assert rc == 0 and all(r.ok for r in recs), [r.error for r in recs]
    assert {(r.images, r.image_pixels) for r in recs} == {(1, 512 * 256)}
    assert [(r.prompt_tokens_requested, r.prompt_tokens) for r in recs] == [(48 + 8, 48 + 8)] * 8


def test_two_images_where_the_model_takes_one_are_http_400(vlm: Engine, tmp_path: Path) -> None:
    """vLLM refuses a second image for BLIP-2 with a 400: every record says so, none is lost,
    and the run exits 3 (no request succeeded)."""
    rc, recs = _run(vlm, tmp_path, 24, "{ count = 2, width = 64, patch = 16, max_side = 64 }", 4)
    assert rc == 3
    assert {(r.outcome, r.http_status, r.images) for r in recs} == {("http_400", 400, 2)}
    assert all("image" in (r.error or "") for r in recs), recs[0].error
