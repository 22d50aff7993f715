"""Byte-level tokenizer: one token per UTF-8 byte, nothing downloaded.

ASCII text of N characters is exactly N tokens, which lets workloads set prompt lengths by
character count. Ids 0..255 are bytes, 256 is end-of-sequence, and the vocabulary is padded
to 320 (a multiple of 64, friendly to matmul kernels); ids 257..319 are never sampled.

Usage::

    tok = ByteTokenizer()
    ids = tok.encode("héllo")          # [104, 195, 169, 108, 108, 111]
    tok.decode(ids)                    # "héllo"
    stream = tok.decode_stream()
    "".join(stream.push(i) for i in ids) + stream.flush()   # "héllo", never half a character

Clients that build their prompts with a Hugging Face tokenizer (``vllm bench serve``, GuideLLM,
AIPerf: their ``--tokenizer``/``--processor``) count as the server does when given this one as a
HF tokenizer folder::

    python3 -m reference_server.tokenizer DIR    # tokenizer.json + tokenizer_config.json
"""

from __future__ import annotations

import codecs
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["HF_CHAT_TEMPLATE", "HF_EOS", "ByteTokenizer", "StreamDecoder", "write_hf_tokenizer"]

NUM_BYTES = 256
HF_EOS = "<|loadlab_eos|>"  # a name no prompt holds: the HF tokenizer would match it as one token
# The server's chat formatting (protocol.chat_prompt): contents joined by "\n", no role markers,
# nothing added for the generation prompt; a list of parts counts by its text parts.
HF_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if not loop.first %}{{ '\n' }}{% endif %}"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for p in m['content'] %}{{ p['text'] or '' }}{% endfor %}"
    "{% endif %}{% endfor %}"
)


class StreamDecoder:
    """Turns token ids into text one at a time, holding back incomplete UTF-8 sequences.

    Special ids (eos, padding) produce no text.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text completed by this token ("" while a multi-byte character is incomplete)."""
        if not 0 <= token_id < NUM_BYTES:
            return ""
        return self._decoder.decode(bytes((token_id,)))

    def flush(self) -> str:
        """Whatever is left at the end of the stream (a dangling partial character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)


class ByteTokenizer:
    """UTF-8 bytes as token ids; ``eos_id`` = 256; ``vocab_size`` = 320 (padded)."""

    eos_id: int = NUM_BYTES
    vocab_size: int = 320
    num_byte_tokens: int = NUM_BYTES

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``: its UTF-8 bytes."""
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; special ids are dropped and invalid UTF-8 becomes U+FFFD."""
        return bytes(i for i in ids if 0 <= i < NUM_BYTES).decode("utf-8", errors="replace")

    def decode_stream(self) -> StreamDecoder:
        """A fresh incremental decoder for one streamed response."""
        return StreamDecoder()

    def count(self, text: str) -> int:
        """Number of tokens ``text`` encodes to (its UTF-8 length)."""
        return len(text.encode("utf-8"))


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-character table, which HF's ByteLevel pre-tokenizer and decoder use:
    printable bytes stand for themselves, the others for characters from U+0100 on."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    extra = iter(range(NUM_BYTES, 2 * NUM_BYTES))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(NUM_BYTES)]


def write_hf_tokenizer(folder: Path, *, max_model_len: int = 2048) -> Path:
    """Write the byte tokenizer as a Hugging Face tokenizer folder; returns ``folder``.

    A byte-level BPE with no merges: byte ``b`` is token ``b``, as here; ``HF_EOS`` is 256. With
    ``HF_CHAT_TEMPLATE``, ``apply_chat_template`` gives the text the chat route counts. Written
    as JSON, so no tokenizer package is needed to make it.
    """
    byte_level = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    eos = {"id": ByteTokenizer.eos_id, "content": HF_EOS, "single_word": False, "lstrip": False,
           "rstrip": False, "normalized": False, "special": True}  # fmt: skip
    tokenizer: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [eos],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": None,  # no BOS: the server adds nothing to a prompt
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {c: i for i, c in enumerate(_byte_chars())} | {HF_EOS: ByteTokenizer.eos_id},
            "merges": [],
        },
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": HF_EOS,
        "model_max_length": max_model_len,
        "clean_up_tokenization_spaces": False,
        "chat_template": HF_CHAT_TEMPLATE,
        "added_tokens_decoder": {str(eos["id"]): {k: v for k, v in eos.items() if k != "id"}},
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, indent=1))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: python3 -m reference_server.tokenizer DIR  (writes a HF tokenizer folder)")
    print(f"byte tokenizer written to {write_hf_tokenizer(Path(sys.argv[1]))}")
