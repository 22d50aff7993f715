"""Tokenizer loading and server-side counts, with a BPE tokenizer trained on the spot."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from loadlab.workloads._params import WorkloadError
from loadlab.workloads._tokenizers import (
    ByteTokens,
    HFTokens,
    check_tokenizer,
    hf_cache_snapshot,
    load_tokenizer,
)
from tests.helpers.bpe import BOS, make_tokenizer_dir


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer_dir(tmp_path_factory.mktemp("bpe") / "tiny")


def test_chat_count_is_the_rendered_template_encoded_without_added_specials(tok_dir):
    tok = load_tokenizer(str(tok_dir))
    assert isinstance(tok, HFTokens)
    text = tok.render_chat([{"role": "user", "content": " hello there "}])
    # the template's own BOS, the role header, the trimmed content, the generation prompt
    assert text == (
        f"{BOS}<|start_header_id|>user<|end_header_id|>\n\nhello there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert tok.count_prompt(" hello there ", "chat") == len(tok.encode(text))
    assert tok.count_prompt(" hello there ", "anthropic") == len(tok.encode(text))
    assert text.count(BOS) == 1  # not doubled by the post-processor


def test_completions_count_adds_the_post_processor_bos(tok_dir):
    tok = load_tokenizer(str(tok_dir / "tokenizer.json"))
    assert tok.count_prompt("the model", "completions") == len(tok.encode("the model")) + 1


def test_chat_template_file_wins_and_missing_template_means_ask_the_server(tmp_path, tok_dir):
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((tok_dir / "tokenizer.json").read_bytes())
    bare = load_tokenizer(str(folder))
    assert bare.count_prompt("hi", "chat") is None  # unknown template: not a guess
    (folder / "chat_template.jinja").write_text("[{{ messages[0]['content'] }}]")
    load_tokenizer.cache_clear()
    tok = load_tokenizer(str(folder))
    assert tok.count_prompt("hi", "chat") == len(tok.encode("[hi]"))


def test_model_id_is_found_in_the_local_hf_cache_only(tmp_path, tok_dir, monkeypatch):
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (snap / name).write_bytes((tok_dir / name).read_bytes())
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hf_cache_snapshot("org/tiny") == snap
    assert load_tokenizer("org/tiny").count_prompt("x", "chat") is not None
    with pytest.raises(WorkloadError, match="not a model id in the local HuggingFace cache"):
        load_tokenizer("org/absent")


def test_tiktoken_file(tmp_path):
    pytest.importorskip("tiktoken")
    ranks = [bytes([b]) for b in range(256)] + [b"th", b"the", b" the"]
    lines = [f"{base64.b64encode(t).decode()} {i}" for i, t in enumerate(ranks)]
    path = tmp_path / "mini.tiktoken"
    path.write_text("\n".join(lines) + "\n")
    tok = load_tokenizer(str(path))
    assert tok.encode(" the the") == [258, 258]
    assert tok.count_prompt(" the the", "completions") == 2
    assert tok.count_prompt("x", "chat") is None


def test_byte_tokenizer_is_the_reference_servers():
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteTokens)
    assert tok.count_prompt("héllo", "chat") == 6


def test_bad_tokenizers_fail_up_front_with_the_fix(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps({"not": "a tokenizer"}))
    with pytest.raises(WorkloadError, match="cannot be read"):
        check_tokenizer("tokenizer.json", (tmp_path,))
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkloadError, match=r"has no tokenizer\.json"):
        check_tokenizer(str(tmp_path / "empty"))
    check_tokenizer("auto")  # asks the server at run time: nothing to check now
