"""Byte tokenizer: round trips, lengths and streaming that never splits a character."""

from __future__ import annotations

from reference_server.tokenizer import ByteTokenizer


def test_ascii_is_one_token_per_char() -> None:
    tok = ByteTokenizer()
    assert tok.encode("Hi!") == [72, 105, 33]
    assert tok.count("x" * 1000) == 1000
    assert tok.decode([72, 105, 33]) == "Hi!"


def test_round_trip_multibyte() -> None:
    tok = ByteTokenizer()
    text = "héllo, 世界 🙂"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8")) == 19
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text


def test_specials_are_dropped_and_ids_fit_vocab() -> None:
    tok = ByteTokenizer()
    assert tok.eos_id == 256 and tok.vocab_size == 320
    assert tok.decode([104, tok.eos_id, 105, 300]) == "hi"


def test_stream_never_splits_a_character() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("a世🙂")  # 1 + 3 + 4 bytes
    stream = tok.decode_stream()
    pieces = [stream.push(i) for i in ids]
    assert pieces == ["a", "", "", "世", "", "", "", "🙂"]
    assert stream.flush() == ""


def test_stream_dangling_partial_character_becomes_replacement() -> None:
    stream = ByteTokenizer().decode_stream()
    assert stream.push(0xE4) == ""  # first byte of a 3-byte character
    assert stream.push(256) == ""  # eos produces no text
    assert stream.flush() == "\ufffd"
