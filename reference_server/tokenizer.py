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
"""

from __future__ import annotations

import codecs

__all__ = ["ByteTokenizer", "StreamDecoder"]

NUM_BYTES = 256


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
