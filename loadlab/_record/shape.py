"""A request's shape without its text: what ``loadlab record`` keeps of each request body.

``RequestShape.of(api, body, salt)`` reads an OpenAI chat / completions / Responses or an
Anthropic messages body and keeps only what changes the load:

- the model, the stream flag, ``max_tokens`` (under each API's name) and the sampling settings
  that change the work (``n``, ``best_of``, ``ignore_eos``, ``min_tokens``, ``logprobs``,
  ``reasoning_effort``, ...): values, never text;
- messages per role, tool definitions and tool calls counted (with their size in the trace's
  unit), images counted with their width and height where the body carries the pixels;
- the prompt as salted block hashes: the prompt's text laid out once as a model reads it less
  the server's chat template (the messages' texts joined by newlines, an earlier answer's tool
  calls by their arguments) is cut into blocks of ``block`` units (characters, or tokens when a
  tokenizer is given) and each block's id is a hash of the salt, the previous block's id and
  the block, so two prompts that share a prefix share their first ids and nothing else about
  the text can be learnt without the salt, which never leaves the process. No role marker is
  laid out: the template adds the same ones to a replay's messages, so a replay built from the
  ids shares what the recorded prompts shared, block for block of the server's prompt;
- a chain hash per message, so a request that repeats an earlier request's messages and adds
  to them (a conversation's next turn, an agent's next step) is found as its continuation.

Example::

    salt = os.urandom(32)
    shape = RequestShape.of("chat", {"model": "m", "messages": [...]}, salt=salt, block=16)
    shape.hash_ids, shape.roles, shape.message_chain[-1]
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LOAD_PARAMS", "RequestShape", "block_ids", "image_size"]

# Settings that change how much work a request is (kept by value); everything else is dropped.
LOAD_PARAMS = (
    "n",
    "best_of",
    "ignore_eos",
    "min_tokens",
    "logprobs",
    "top_logprobs",
    "reasoning_effort",
    "temperature",
    "top_p",
    "top_k",
    "seed",
)
_MAX_TOKEN_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")

Tokenize = Callable[[str], Sequence[int]]


def _digest(salt: bytes, prev: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(prev + data, key=salt[:64], digest_size=8).digest()


def block_ids(units: Sequence[Any] | str, block: int, salt: bytes) -> list[int]:
    """Chained, salted ids of each whole block of ``units`` (a partial last block has none).

    >>> a = block_ids("x" * 40, 16, b"s")
    >>> b = block_ids("x" * 32 + "y" * 8, 16, b"s")
    >>> len(a), a == b, block_ids("x" * 40, 16, b"t") == a
    (2, True, False)
    """
    # Block k's id is the keyed hash of the prompt up to its end: blocks hold a fixed number of
    # units, so equal ids are equal prefixes. One running hash, copied at each block's end,
    # costs half of hashing each block anew.
    ids: list[int] = []
    running = hashlib.blake2b(key=salt[:64], digest_size=8)
    if isinstance(units, str) and units.isascii():
        data, step = units.encode(), block  # one byte a character: cut the bytes
    else:
        data, step = b"", 0
    for start in range(0, len(units) - block + 1, block):
        if step:
            running.update(data[start : start + block])
        else:
            part = units[start : start + block]
            running.update(
                part.encode() if isinstance(part, str) else struct.pack(f"<{len(part)}q", *part)
            )
        ids.append(
            int.from_bytes(running.copy().digest(), "little") >> 11
        )  # 53 bits: exact in JSON
    return ids


def image_size(url: str) -> tuple[int, int] | None:
    """Width and height of a PNG, JPEG, GIF or WebP given as a ``data:`` URL (None when the URL
    is remote or the header cannot be read): the pixels are counted, never kept."""
    if not url.startswith("data:") or "," not in url:
        return None
    head, _, payload = url.partition(",")
    try:
        raw = base64.b64decode(payload[:65536], validate=False) if ";base64" in head else b""
    except (binascii.Error, ValueError):
        return None
    return _dimensions(raw)


def _dimensions(raw: bytes) -> tuple[int, int] | None:
    if raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) >= 24:
        w, h = struct.unpack(">II", raw[16:24])
        return int(w), int(h)
    if raw[:6] in (b"GIF87a", b"GIF89a") and len(raw) >= 10:
        w, h = struct.unpack("<HH", raw[6:10])
        return int(w), int(h)
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP" and raw[12:16] == b"VP8X" and len(raw) >= 30:
        w = int.from_bytes(raw[24:27], "little") + 1
        h = int.from_bytes(raw[27:30], "little") + 1
        return w, h
    if raw[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(raw):
            if raw[i] != 0xFF:
                return None
            marker, length = raw[i + 1], int.from_bytes(raw[i + 2 : i + 4], "big")
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                h, w = struct.unpack(">HH", raw[i + 5 : i + 9])
                return int(w), int(h)
            i += 2 + length
    return None


@dataclass
class _Walk:
    """What walking one body's messages found (text is only ever held here, in memory)."""

    roles: dict[str, int] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)  # each message's text
    order: list[str] = field(default_factory=list)  # each message's role
    chain: list[bytes] = field(default_factory=list)
    tool_calls: int = 0
    images: list[list[int]] = field(default_factory=list)
    images_unsized: int = 0

    def content(self, value: Any) -> str:
        """The text of one message's content; images and audio counted, not kept."""
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            return "" if value is None else str(value)
        out = []
        for part in value:
            if not isinstance(part, Mapping):
                continue
            kind = part.get("type")
            if kind in ("text", "input_text", "output_text"):
                out.append(str(part.get("text", "")))
            elif kind in ("image_url", "input_image", "image"):
                self._image(part)
            elif kind == "tool_result":
                out.append(self.content(part.get("content")))
            elif kind == "tool_use":
                self.tool_calls += 1
                out.append(json.dumps(part.get("input", {})))  # as a call's arguments
        return "".join(out)

    def _image(self, part: Mapping[str, Any]) -> None:
        src = part.get("image_url", part.get("source"))
        url = src.get("url", "") if isinstance(src, Mapping) else src
        if isinstance(src, Mapping) and src.get("type") == "base64":
            url = f"data:{src.get('media_type', '')};base64,{src.get('data', '')}"
        size = image_size(url) if isinstance(url, str) else None
        if size is None:
            self.images_unsized += 1
        else:
            self.images.append(list(size))

    def message(self, role: str, text: str, salt: bytes) -> None:
        self.roles[role] = self.roles.get(role, 0) + 1
        self.texts.append(text)
        self.order.append(role)
        prev = self.chain[-1] if self.chain else b""
        self.chain.append(_digest(salt, prev, f"<{role}>{text}".encode()))

    def layout(self) -> str:
        """The prompt as a server's model reads it, less its chat template: the messages' texts
        joined by newlines (so a block of the layout is a block of the server's prompt)."""
        return "\n".join(self.texts)


@dataclass(frozen=True)
class RequestShape:
    """One request body's shape (see the module docstring); no text, no key."""

    api: str
    model: str | None
    stream: bool
    max_tokens: int | None
    params: dict[str, Any]
    roles: dict[str, int]
    prompt_length: int  # the laid-out prompt, in the trace's unit
    hash_ids: list[int]
    message_chain: list[bytes]  # per message, in memory only (finds continuations)
    message_lengths: list[int]  # per message, in the trace's unit
    message_roles: list[str]
    tools: int
    tools_length: int
    tool_calls: int
    images: list[list[int]]
    images_unsized: int
    wants_usage: bool  # a stream that asked for usage itself
    tool_choice: str | None  # "auto", "required", "none", ... or "named"; never a tool's name

    @classmethod
    def of(
        cls,
        api: str,
        body: Mapping[str, Any],
        *,
        salt: bytes,
        block: int = 16,
        tokenize: Tokenize | None = None,
    ) -> RequestShape:
        walk = _Walk()
        system = body.get("system", body.get("instructions"))
        if system:
            walk.message("system", walk.content(system), salt)
        if api == "completions":
            prompt = body.get("prompt", "")
            walk.message(
                "prompt",
                "".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt),
                salt,
            )
        elif api == "responses" and isinstance(body.get("input"), str):
            walk.message("user", body["input"], salt)
        else:
            items = body.get("messages", body.get("input", []))
            for m in items if isinstance(items, list) else []:
                if not isinstance(m, Mapping):
                    continue
                calls = m.get("tool_calls") or []
                walk.tool_calls += len(calls) if isinstance(calls, list) else 0
                text = walk.content(m.get("content"))
                # an earlier answer's calls, by their arguments
                if isinstance(calls, list) and calls:
                    text = "\n".join([text, *(_arguments(c) for c in calls)])
                elif m.get("type") == "function_call":  # the Responses API's form
                    text = str(m.get("arguments", ""))
                role = str(m.get("role", m.get("type", "user")))
                if role == "function_call_output" or _holds_tool_result(m.get("content")):
                    role = "tool"
                walk.message(role, text, salt)
        tools = body.get("tools") or []
        tools_text = str(tools) if tools else ""
        measure: Callable[[str], int] = (lambda s: len(tokenize(s))) if tokenize else len
        prompt_text = walk.layout()
        units: Sequence[Any] | str = tokenize(prompt_text) if tokenize else prompt_text
        stream_options = body.get("stream_options")
        return cls(
            api=api,
            model=body.get("model") if isinstance(body.get("model"), str) else None,
            stream=bool(body.get("stream", False)),
            max_tokens=next(
                (int(body[k]) for k in _MAX_TOKEN_KEYS if isinstance(body.get(k), int)), None
            ),
            params={k: body[k] for k in LOAD_PARAMS if _plain(body.get(k))},
            roles=walk.roles,
            prompt_length=len(units),
            hash_ids=block_ids(units, block, salt),
            message_chain=walk.chain,
            message_lengths=[measure(t) for t in walk.texts],
            message_roles=walk.order,
            tools=len(tools) if isinstance(tools, list) else 0,
            tools_length=measure(tools_text),
            tool_calls=walk.tool_calls,
            images=walk.images,
            images_unsized=walk.images_unsized,
            wants_usage=isinstance(stream_options, Mapping)
            and bool(stream_options.get("include_usage")),
            tool_choice=_tool_choice(body.get("tool_choice")),
        )


def _plain(value: Any) -> bool:
    """A setting's value is kept only when it is a number, a bool or a short keyword."""
    if isinstance(value, bool | int | float):
        return True
    return isinstance(value, str) and len(value) <= 16 and value.isidentifier()


def _tool_choice(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and value in ("auto", "required", "none", "any"):
        return value
    if isinstance(value, Mapping) and value.get("type") in ("auto", "any", "none"):
        return str(value["type"])
    return "named"


def _arguments(call: Any) -> str:
    """A tool call's arguments as the model wrote them (``str`` of anything else)."""
    fn = call.get("function") if isinstance(call, Mapping) else None
    if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
        return str(fn["arguments"])
    return str(call)


def _holds_tool_result(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(p, Mapping) and p.get("type") == "tool_result" for p in content
    )
