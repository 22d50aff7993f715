"""What the proxy keeps of a request body: counts, sizes and salted hashes, never text."""

from __future__ import annotations

import base64
import json
import struct
import zlib

from loadlab._record.shape import RequestShape, block_ids, image_size
from loadlab._record.stream import StreamWatch

SALT = b"0123456789abcdef0123456789abcdef"


def _png(width: int, height: int) -> bytes:
    """A real PNG, drawn here: a grey image of the given size."""
    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def test_shared_prefixes_share_their_first_ids_and_only_those() -> None:
    a = block_ids("s" * 64 + "a" * 40, 16, SALT)
    b = block_ids("s" * 64 + "b" * 40, 16, SALT)
    assert a[:4] == b[:4] and a[4:] != b[4:] and len(a) == 6
    assert block_ids("s" * 64, 16, b"another salt....") != a[:4]  # the salt is the key


def test_a_chat_body_becomes_counts_and_hashes() -> None:
    png = base64.b64encode(_png(31, 17)).decode()
    body = {
        "model": "m",
        "stream": True,
        "max_completion_tokens": 50,
        "n": 2,
        "temperature": 0.7,
        "user": "alice@example.com",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
            ]},
        ],
    }  # fmt: skip
    s = RequestShape.of("chat", body, salt=SALT, block=4)
    assert s.model == "m" and s.stream and s.max_tokens == 50
    assert s.params == {"n": 2, "temperature": 0.7}  # "user" is text: not kept
    assert s.roles == {"system": 1, "user": 1} and s.message_roles == ["system", "user"]
    assert s.message_lengths == [len("be brief"), len("what is this")]
    assert s.images == [[31, 17]] and s.images_unsized == 1
    assert s.tools == 1 and s.tool_choice == "named"  # never the tool's name
    assert not s.wants_usage
    assert s.prompt_length == len("be brief\nwhat is this")  # no role marker: the template's
    assert len(s.hash_ids) == s.prompt_length // 4


def test_a_later_turn_repeats_the_earlier_chain() -> None:
    first = {"messages": [{"role": "user", "content": "hello there"}]}
    second = {"messages": [*first["messages"], {"role": "assistant", "content": "hi"},
                           {"role": "user", "content": "more"}]}  # fmt: skip
    a = RequestShape.of("chat", first, salt=SALT)
    b = RequestShape.of("chat", second, salt=SALT)
    assert b.message_chain[0] == a.message_chain[-1]
    assert b.message_chain[-1] != a.message_chain[-1]


def test_anthropic_and_completions_bodies() -> None:
    anthropic = {
        "model": "claude-x",
        "max_tokens": 10,
        "system": "sys",
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]},
        ],
    }  # fmt: skip
    s = RequestShape.of("anthropic", anthropic, salt=SALT)
    assert s.message_roles == ["system", "user", "assistant", "tool"] and s.tool_calls == 1
    c = RequestShape.of("completions", {"prompt": "abc", "max_tokens": 3}, salt=SALT)
    assert c.message_lengths == [3] and c.max_tokens == 3


def test_image_size_reads_headers_only() -> None:
    assert image_size("data:image/png;base64," + base64.b64encode(_png(640, 480)).decode()) == (
        640,
        480,
    )
    assert image_size("https://example.com/a.png") is None
    assert image_size("data:image/png;base64,!!!notbase64") is None


def _sse(*objs: object) -> bytes:
    return (
        b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + b"data: [DONE]\n\n"
    )


def test_the_usage_event_the_proxy_asked_for_is_taken_out_and_counted() -> None:
    stream = _sse(
        {"choices": [{"delta": {"role": "assistant"}}]},
        {"choices": [{"delta": {"content": "ab"}}]},
        {"choices": [{"delta": {"reasoning_content": "c"}}]},
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2,
                                  "prompt_tokens_details": {"cached_tokens": 4}}},
    )  # fmt: skip
    watch = StreamWatch("chat", True, drop_usage_event=True)
    out = b"".join(watch.feed(stream[i : i + 7], 1000 + i) or b"" for i in range(0, len(stream), 7))
    out += watch.finish()
    assert b"usage" not in out and out.endswith(b"data: [DONE]\n\n")
    assert out == stream.replace(out.split(b"\n\n")[0], out.split(b"\n\n")[0]).replace(
        b'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2, '
        b'"prompt_tokens_details": {"cached_tokens": 4}}}\n\n',
        b"",
    )
    assert len(watch.token_times_ns) == 2
    assert (watch.usage.prompt_tokens, watch.usage.output_tokens, watch.usage.cached_tokens) == (
        7,
        2,
        4,
    )


def test_a_client_that_asked_for_usage_gets_every_byte() -> None:
    stream = _sse(
        {"choices": [{"delta": {"content": "x"}}]},
        {"choices": [], "usage": {"completion_tokens": 1}},
    )
    watch = StreamWatch("chat", True)
    assert watch.feed(stream, 5) is None and watch.finish() == b""
    assert watch.usage.output_tokens == 1 and watch.token_times_ns == [5]
