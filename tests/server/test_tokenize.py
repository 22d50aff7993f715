"""The reference server's /tokenize (vLLM's shape), and loadlab sizing prompts against it."""

from __future__ import annotations

from typing import Any

import pytest

from loadlab._analysis.token_checks import prompt_match
from loadlab._runner.run import run
from loadlab.clients._counting import post_json, server_counter, server_says_byte
from loadlab.config import EndpointConfig, RunConfig
from tests.helpers.server import AUTH


def test_tokenize_counts_as_the_completion_routes_do(continuous_server: Any) -> None:
    url = continuous_server.url + "/tokenize"
    headers = {"Content-Type": "application/json", **AUTH}
    out = post_json(url, {"model": "loadlab-ref", "prompt": "héllo"}, headers)
    assert out["count"] == 6 and out["tokens"] == list("héllo".encode())
    assert out["max_model_len"] == 128
    msgs = [{"role": "system", "content": "ab"}, {"role": "user", "content": "cd"}]
    chat = post_json(url, {"model": "loadlab-ref", "messages": msgs}, headers)
    assert chat["count"] == 5  # "ab\ncd": the chat formatting joins contents with "\n"


@pytest.mark.parametrize("api", ["chat", "completions"])
@pytest.mark.parametrize("method", ["server", "auto", "byte"])
def test_run_sends_prompts_the_server_counts_as_requested(
    continuous_server: Any, api: str, method: str
) -> None:
    ep = EndpointConfig(continuous_server.url, model="loadlab-ref", api=api,
                        api_key_env="LOADLAB_TEST_KEY")  # fmt: skip
    assert server_says_byte(ep)
    counter = server_counter(ep)
    assert counter is not None and counter.url.endswith("/tokenize")
    cfg = RunConfig(concurrency=4, requests=12, max_tokens=4, endpoints=(ep,), progress=False,
                    tokenizer=method,
                    workload={"kind": "synthetic",
                              "prompt_tokens": {"dist": "uniform", "low": 5, "high": 100}})  # fmt: skip
    results = run(cfg, write=False).runs[0].results
    assert all(r.ok for r in results.records)
    match = prompt_match(results.records)
    assert match.compared == 12 and match.exact == 12, match


def test_loadlab_run_prints_the_match_and_warns_on_misses(
    continuous_server: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from loadlab.cli import main

    base = ["run", "--endpoint", continuous_server.url, "--model", "loadlab-ref",
            "--api-key-env", "LOADLAB_TEST_KEY", "--concurrency", "2", "--requests", "6",
            "--prompt-tokens", "40", "--max-tokens", "2", "--no-progress"]  # fmt: skip
    wrong = tmp_path / "wrong.toml"  # 3 characters per token on a byte tokenizer: 3x long
    wrong.write_text('[workload]\nkind = "synthetic"\nchars_per_token = 3.0\n')
    assert main([*base, "--scenario", str(wrong), "--out", str(tmp_path / "a.json")]) == 0
    out, err = capsys.readouterr()
    assert "prompts     0 of 6 exactly the requested length" in out
    assert "6 of 6 requests' prompts were counted by the server more than one token away" in err
    args = [
        *base,
        "--scenario",
        str(wrong),
        "--tokenizer",
        "auto",
        "--out",
        str(tmp_path / "b.json"),
    ]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "prompts     6 of 6 exactly the requested length\n" in out and "--tokenizer" not in err


def test_dataset_prompts_cut_to_the_requested_length_as_the_server_counts(
    continuous_server: Any,
) -> None:
    from loadlab.workloads._params import PACKAGE_DATA

    ep = EndpointConfig(continuous_server.url, model="loadlab-ref", api_key_env="LOADLAB_TEST_KEY")
    path = str(PACKAGE_DATA / "samples" / "sharegpt.json")
    cfg = RunConfig(concurrency=2, requests=6, max_tokens=2, endpoints=(ep,), progress=False,
                    workload={"kind": "dataset", "path": path, "turns": "first",
                              "prompt_tokens": 60, "output_tokens": 2})  # fmt: skip
    results = run(cfg, write=False).runs[0].results  # tokenizer "auto": RunConfig's default
    assert all(r.ok for r in results.records) and len(results.records) == 6
    match = prompt_match(results.records)
    assert match.compared == 6 and match.exact == 6, match


def test_the_byte_tokenizer_as_a_hf_folder_counts_as_the_server(tmp_path: Any) -> None:
    # What vllm bench serve, GuideLLM and AIPerf are pointed at (docs/tested-against.md): their
    # prompts must hold, by their count, the tokens the server counts.
    tokenizers = pytest.importorskip("tokenizers")
    from loadlab.workloads._tokenizers import load_tokenizer
    from reference_server.protocol import ChatMessage, chat_prompt
    from reference_server.tokenizer import HF_EOS, ByteTokenizer, write_hf_tokenizer

    folder = write_hf_tokenizer(tmp_path / "byte")
    hf = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert hf.token_to_id(HF_EOS) == ByteTokenizer.eos_id
    for text in ["hello world", "  two  spaces\n\ttab", "héllo ✓ 日本語", "~!@#$%^&*()_+{}|"]:
        ids = hf.encode(text).ids
        assert ids == ByteTokenizer().encode(text) and hf.decode(ids) == text
    msgs = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "héllo"}]}]  # fmt: skip
    tok = load_tokenizer(str(folder))  # renders the chat template as transformers does
    served = chat_prompt([ChatMessage.model_validate(m) for m in msgs])
    assert tok.render_chat(msgs) == served
    assert tok.count_prompt("héllo", "chat") == tok.count_prompt("héllo", "completions") == 6


def test_back_to_back_runs_start_cold_unless_the_seed_repeats(continuous_server: Any) -> None:
    """Each run draws its own seed, so a second run finds none of the first's prompts in the
    server's prefix cache; the same seed again is served from it."""
    ep = EndpointConfig(continuous_server.url, model="loadlab-ref", api_key_env="LOADLAB_TEST_KEY")
    cfg = RunConfig(concurrency=2, requests=8, prompt_tokens=64, max_tokens=2, endpoints=(ep,),
                    progress=False)  # fmt: skip

    def cached_share(results: Any) -> float:
        ok = [r for r in results.records if r.ok]
        assert len(ok) == 8
        return sum(r.cached_prompt_tokens or 0 for r in ok) / sum(r.prompt_tokens for r in ok)

    first, second = (run(cfg, write=False).runs[0].results for _ in range(2))
    assert first.config["seed"] != second.config["seed"]
    assert cached_share(first) <= 0.02 and cached_share(second) <= 0.02  # both cold
    again = run(cfg.replace(seed=second.config["seed"]), write=False).runs[0].results
    assert cached_share(again) >= 0.5  # its 16-token blocks, all but the last, were cached
