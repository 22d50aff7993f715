"""The sans-IO core shared by every streaming API dialect: record bookkeeping and outcomes.

``StreamState`` owns what does not depend on the dialect: stamping ``sent``/``headers``/``end``,
HTTP status and ``Retry-After``, the SSE decoder, telling a non-SSE body from a stream, keeping
an error body's excerpt (with secrets scrubbed), deciding the outcome at EOF or on a transport
failure, and turning the server's usage into token counts. The per-read path (``on_bytes``:
the SSE decode, and a fast path for a stream's repeated token frame) is ``TokenFrameState``'s
(``loadlab.clients._token_frame``), which every dialect subclasses. A dialect
(``OpenAIStreamState``, ``AnthropicStreamState``) supplies three things:

- ``_event(data, event, t_rel)``: one SSE event (the per-chunk hot path; append ``t_rel`` to
  ``_stamps``, which ``finish`` turns into ``record.chunk_ns``, for a token-carrying event;
  return True once a failure is decided);
- ``_answer(obj, raw, t_ns)``: a non-streaming 200 JSON body;
- ``_complete()``: whether a stream that reached EOF without its end marker (``done``) still
  counts as complete (OpenAI: a ``finish_reason`` came; Anthropic: never);

plus the usage key names (``PROMPT_KEY``, ``OUTPUT_KEY``).

Example::

    state = OpenAIStreamState(record, "chat", t0_ns=t0)
    state.on_headers(200, {"Content-Type": "text/event-stream"}, now())
    state.on_bytes(b'data: {"choices": [{"delta": {"content": "A"}}]}\\n\\n', now())
    state.finish(now())  # record.outcome is now decided
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from email.utils import parsedate_to_datetime
from typing import Any

from loadlab._headers import public_url
from loadlab.clients._sse import MAX_EVENT_BYTES, SSEDecoder
from loadlab.records import (
    OUTCOME_INCOMPLETE,
    OUTCOME_OK,
    OUTCOME_PROTOCOL_ERROR,
    OUTCOME_STREAM_ERROR,
    RequestRecord,
    http_outcome,
    printable,
)

loads: Callable[[str | bytes], Any]
try:  # a faster JSON parser when present (~4x on small chunks); same results
    import orjson
    from orjson import loads
except ImportError:  # pragma: no cover
    orjson = None  # type: ignore[assignment]
    loads = json.loads


def dumps(obj: Any) -> bytes:
    """A request body as compact JSON bytes: orjson (~15x faster than json on a request), or
    json for what orjson refuses (non-string keys, integers past 64 bits)."""
    if orjson is not None:
        try:
            return orjson.dumps(obj)
        except TypeError:
            pass
    return json.dumps(obj, separators=(",", ":")).encode()


__all__ = ["StreamState", "dumps", "excerpt", "loads", "retry_after_s", "token_count"]

_EXCERPT_CHARS = 200
_BODY_KEEP_BYTES = 4096  # of an error body, for the excerpt
_SSE_STARTS = (b"data", b"event", b"id", b"retry", b":")


def excerpt(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` with every secret replaced by ``***``, whitespace folded, what a terminal
    would act on escaped (``printable``), cut to 200 chars."""
    for s in secrets:
        text = text.replace(s, "***")
    text = printable(" ".join(text.split()))
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."


def token_count(value: Any) -> int | None:
    """A token count from a server's usage: a whole number >= 0, else None (not taken).

    >>> token_count(12), token_count(-5), token_count(True), token_count(1.5)
    (12, None, None, None)
    """
    return value if type(value) is int and value >= 0 else None


def retry_after_s(value: str) -> float | None:
    """``Retry-After``: delay-seconds or an HTTP-date (RFC 9110 §10.2.3); a value that is
    not a finite number of seconds (``inf``, ``nan``) is none (the results file is strict JSON).
    """
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class StreamState:
    """Interprets one response; no I/O. All ``t_ns`` are raw ``time.perf_counter_ns()``.

    Call ``on_headers`` once, ``on_bytes`` for each read (it returns True once the outcome is
    decided and reading may stop), then ``finish`` at EOF (``eof=True``) or ``fail`` when the
    transport failed. ``text`` is the answer's content (for a chat session's history).
    """

    __slots__ = (
        "_any_event",
        "_body",
        "_calls",
        "_decoder",
        "_head",
        "_header_id",
        "_location",
        "_outcome",
        "_parts",
        "_sse",
        "_stamps",
        "_t0",
        "_usage_at",
        "done",
        "record",
        "secrets",
        "stream",
        "token_ends",
        "usage",
    )

    PROMPT_KEY = "prompt_tokens"  # usage key names of the dialect
    OUTPUT_KEY = "completion_tokens"
    OUTPUT_DETAILS_KEY = "completion_tokens_details"  # where usage says reasoning_tokens
    # response headers that carry the server's id for a request (OpenAI, Anthropic, gateways)
    ID_HEADERS = ("x-request-id", "request-id", "x-amzn-requestid")
    INCOMPLETE = "stream ended before its end marker"  # the incomplete outcome's message

    def __init__(
        self,
        record: RequestRecord,
        *,
        stream: bool = True,
        t0_ns: int = 0,
        secrets: Sequence[str] = (),
        max_event_bytes: int = MAX_EVENT_BYTES,
    ) -> None:
        self.record = record
        self.stream = stream
        self.secrets = tuple(s for s in secrets if s)
        self.done = False  # the stream's end marker seen ([DONE], message_stop)
        self.usage: dict[str, Any] | None = None
        self._t0 = t0_ns
        self._decoder = SSEDecoder(max_event_bytes)
        self._sse = stream  # False: collect the body (non-streaming, an error, a non-SSE 200)
        self._body: list[bytes] = []
        self._parts: list[str] = []
        # token chunks' read times, handed to the record as chunk_ns by finish(). A list: the
        # run freezes the heap every 0.1 s, so the collector walks a stream's list only while
        # it is young and short, and array("q").append parses its argument, over four times
        # the cost of list.append on every chunk
        self._stamps: list[int] = []
        self._outcome: str | None = None
        self._any_event = False
        self._head = b""  # the first bytes, until an event decodes (to spot a non-SSE body)
        self._header_id: str | None = None  # a request-id response header (ID_HEADERS)
        self._location: str | None = None  # a redirect's target (Location), for its error
        self._calls: dict[Any, dict[str, str]] | None = None  # tool calls by index (_tool_*)
        # token chunk index -> cumulative output tokens, from usage sent inside the stream
        # (vLLM/SGLang ``continuous_usage_stats``): the server's own tokens per chunk
        self._usage_at: dict[int, int] | None = None
        # the target model's tokenizer (character end of each token), for tokens per chunk
        # when the server does not say; used once per stream, at its end
        self.token_ends: Callable[[str], Sequence[int]] | None = None

    @property
    def text(self) -> str:
        try:
            return "".join(self._parts)
        except TypeError:  # a server that sent a number as the text
            return "".join(map(str, self._parts))

    @property
    def tool_calls(self) -> tuple[dict[str, str], ...]:
        """The answer's tool calls, ``{"id", "name", "arguments"}`` each (arguments: the
        streamed JSON text), in the order they started."""
        return tuple(self._calls.values()) if self._calls else ()

    # What a dialect's ``_event`` calls for the chunks that are not plain answer content (the
    # content path stays inline in each ``_event``: it is the hot one).

    def _reasoning(self, t_rel: int, stamp: bool = True) -> None:
        """A chunk that carried reasoning: a token chunk (TTFT counts it), counted apart."""
        rec = self.record
        if stamp:
            self._stamps.append(t_rel)
        rec.reasoning_chunks += 1
        if rec.reasoning_start_ns is None:
            rec.reasoning_start_ns = t_rel
        rec.reasoning_end_ns = t_rel

    def _tool_start(self, key: Any, call_id: Any, name: Any) -> None:
        """A tool call begins (its id and function name; arguments follow as deltas)."""
        if self._calls is None:
            self._calls = {}
        if key not in self._calls:
            self.record.tool_calls += 1
            self._calls[key] = {"id": str(call_id or ""), "name": str(name or ""), "arguments": ""}
        else:  # a later delta naming what the first left out
            call = self._calls[key]
            call["id"] = call["id"] or str(call_id or "")
            call["name"] = call["name"] or str(name or "")

    def _tool_args(self, key: Any, args: str, t_rel: int, stamp: bool = True) -> None:
        """A chunk of a tool call's arguments: output tokens, timed like any token chunk."""
        if self._calls is None or key not in self._calls:
            self._tool_start(key, None, None)
        assert self._calls is not None  # noqa: S101 - set just above
        self._calls[key]["arguments"] += args
        if stamp:
            self._stamps.append(t_rel)
        self.record.tool_call_chunks += 1

    def on_sent(self, t_ns: int) -> None:
        """The request bytes are about to go to the socket."""
        self.record.sent_ns = t_ns - self._t0

    def on_headers(self, status: int, headers: Mapping[str, str], t_ns: int) -> None:
        rec = self.record
        rec.http_status = status
        rec.headers_ns = t_ns - self._t0
        for name in self.ID_HEADERS:
            value = headers.get(name)
            # loadlab sends its own X-Request-Id: a server that echoes it says nothing new
            if value and value != rec.request_id:
                self._header_id = value
                break
        if not 200 <= status < 300:
            self._outcome = http_outcome(status)
            self._sse = False
            if 300 <= status < 400:
                self._location = public_url(headers.get("Location") or "(no Location header)")
            retry = headers.get("Retry-After")
            if retry is not None and (seconds := retry_after_s(retry)) is not None:
                rec.server["retry_after_s"] = seconds
        elif self.stream and "text/event-stream" not in headers.get(
            "Content-Type", "text/event-stream"
        ):
            self._sse = False
            rec.error = excerpt(f"expected text/event-stream, got {headers.get('Content-Type')}")

    def on_bytes(self, data: bytes, t_ns: int) -> bool:  # pragma: no cover
        """The bytes of one read; True once the outcome is decided and reading may stop.
        ``TokenFrameState`` (``loadlab.clients._token_frame``) implements it for every dialect."""
        raise NotImplementedError

    def _keep(self, data: bytes) -> bool:
        """A read of a body that is not an SSE stream: kept for ``finish`` (an error body up to
        4 KiB, for its excerpt; a 200 body whole, to parse, up to the event limit)."""
        kept = sum(map(len, self._body))
        if kept < _BODY_KEEP_BYTES:
            self._body.append(data)
        elif self.record.http_status == 200:
            limit = self._decoder.max_bytes
            if kept + len(data) > limit:
                self._body = []
                msg = f"response body over {limit} bytes (raise the limit with --max-event-bytes)"
                return self._set(OUTCOME_PROTOCOL_ERROR, msg)
            self._body.append(data)
        return False

    def _event(self, data: str, event: str, t_rel: int) -> bool:  # pragma: no cover
        raise NotImplementedError

    def _answer(self, obj: dict[str, Any], raw: bytes, t_ns: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def _complete(self) -> bool:
        return False

    def _set(self, outcome: str, message: str) -> bool:
        if self._outcome is None:
            self._outcome = outcome
            self.record.error = excerpt(message, self.secrets)
        return True

    def _json_event(self, data: str) -> dict[str, Any] | None:
        """The event's JSON object; ``None`` (and a protocol error) when it is not one."""
        try:
            obj = loads(data)
        except ValueError:
            self._set(OUTCOME_PROTOCOL_ERROR, "bad JSON in event: " + data)
            return None
        if type(obj) is not dict:
            self._set(OUTCOME_PROTOCOL_ERROR, "event is not a JSON object: " + data)
            return None
        return obj

    def _error(self, obj: dict[str, Any], data: str, where: str = "error in stream") -> bool:
        err = obj.get("error", obj)
        msg = err.get("message", data) if isinstance(err, dict) else str(err)
        return self._set(OUTCOME_STREAM_ERROR, f"{where}: {msg}")

    def fail(self, outcome: str, message: str, t_ns: int) -> None:
        """The transport failed (reset, timeout, cancel). A stream that already sent its end
        marker stays ok; an outcome already decided (an error event, an HTTP status) is kept."""
        if not self.done:
            self._set(outcome, message)
        self.finish(t_ns, eof=False)

    def finish(self, t_ns: int, eof: bool = True) -> None:
        rec = self.record
        rec.end_ns = t_ns - self._t0
        if self._outcome is None and not self.done:
            if not self.stream or not self._sse:
                self._parse_body(t_ns)
            elif not self._any_event and self._head and not self._head.startswith(_SSE_STARTS):
                text = self._head.decode("utf-8", "replace")
                self._set(OUTCOME_PROTOCOL_ERROR, f"body is not an SSE stream: {text}")
            elif not self._complete():
                self._decoder.close()
                self._set(OUTCOME_INCOMPLETE, self.INCOMPLETE)
        elif self._outcome is not None and rec.http_status is not None and rec.http_status >= 300:
            body = b"".join(self._body).decode("utf-8", "replace")
            status = f"HTTP {rec.http_status}"
            if self._location is not None:  # loadlab does not follow: say where it pointed
                status += (
                    f" redirect to {self._location} (not followed: give that URL as --endpoint)"
                )
            rec.error = excerpt(f"{status}: {body}", self.secrets)
        rec.outcome = self._outcome or OUTCOME_OK
        if rec.response_id is None:
            rec.response_id = self._header_id
        if rec.chunk_ns:  # a dialect that appended to the record itself keeps its stamps
            rec.chunk_ns.extend(self._stamps)
        else:  # the list itself: nothing appends to it once the response has ended
            rec.chunk_ns = self._stamps
        self._count_tokens()

    def _parse_body(self, t_ns: int) -> None:
        raw = b"".join(self._body)
        try:
            obj = loads(raw)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            what = self.record.error or "response is not JSON"
            self._set(OUTCOME_PROTOCOL_ERROR, f"{what}: {raw.decode('utf-8', 'replace')}")
            return
        if obj.get("error"):
            self._error(obj, "", "error in 200 body")
            return
        if self.stream:  # JSON where a stream was asked for
            self._set(OUTCOME_PROTOCOL_ERROR, f"{self.record.error}: {raw.decode()}")
            return
        self._answer(obj, raw, t_ns)

    def _prompt_usage(self, usage: dict[str, Any]) -> tuple[int | None, int | None]:
        """Prompt tokens and, of them, those served from the server's prefix cache (OpenAI:
        ``prompt_tokens`` includes ``prompt_tokens_details.cached_tokens``)."""
        prompt = usage.get(self.PROMPT_KEY)
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        prompt = token_count(prompt)
        cached = token_count(cached)
        if cached is not None and prompt is not None and cached > prompt:
            cached = None  # more cached than sent: not a count to take
        return prompt, cached

    def _note_usage(self, usage: Any) -> None:
        """Usage inside a stream: the cumulative output tokens up to the latest token chunk."""
        out = token_count(usage.get(self.OUTPUT_KEY)) if isinstance(usage, dict) else None
        if out is not None and self._stamps:
            if self._usage_at is None:
                self._usage_at = {}
            self._usage_at[len(self._stamps) - 1] = out

    def _chunk_counts(self, total: int | None) -> tuple[list[int], str] | None:
        """Each token chunk's token count and who said it (``server``: cumulative usage on
        every chunk; ``tokenizer``: the streamed text split at the chunks' boundaries), or
        None when every chunk is one token (the usage equals the chunk count) or nothing
        can say. Once per stream, after its last byte: nothing on the per-chunk path."""
        n = len(self.record.chunk_ns)
        at = self._usage_at
        if at is not None and len(at) >= n and all(i in at for i in range(n)):
            cum = [at[i] for i in range(n)]
            counts = [cum[0], *(b - a for a, b in itertools.pairwise(cum))]
            if all(c >= 1 for c in counts):
                return counts, "server"
        if total == n:
            return None
        parts = self._parts
        if self.token_ends is None or len(parts) != n or not all(type(p) is str for p in parts):
            return None  # reasoning chunks carry no text here: their split is unknown
        text = "".join(parts)
        try:
            ends = self.token_ends(text)
        except Exception:
            return None
        counts, i, pos = [], 0, 0
        for part in parts:  # tokens ending inside each chunk (a token split over two: the later)
            pos += len(part)
            k = 0
            while i < len(ends) and ends[i] <= pos:
                i, k = i + 1, k + 1
            counts.append(max(1, k))  # a chunk that carried text carried (part of) a token
        return counts, "tokenizer"

    def _count_tokens(self) -> None:
        rec = self.record
        rec.output_tokens_chunks = len(rec.chunk_ns) if self.stream else 0
        usage = self.usage if isinstance(self.usage, dict) else {}
        if usage:
            rec.prompt_tokens, rec.cached_prompt_tokens = self._prompt_usage(usage)
        completion = usage.get(self.OUTPUT_KEY)
        # a usage that is not a count (-5, 1.5, "7"): the tokens are counted as if it were
        # absent, and the record says its usage disagrees
        bad_usage = completion is not None and token_count(completion) is None
        completion = token_count(completion)
        split = None
        if self.stream and rec.chunk_ns and not rec.chunk_tokens:
            split = self._chunk_counts(completion)
            if split is not None:
                rec.chunk_tokens = split[0]
        streamed = sum(rec.chunk_tokens) if split is not None else rec.output_tokens_chunks
        rec.output_tokens_disagree = bad_usage
        if completion is not None:
            rec.output_tokens, rec.output_tokens_source = completion, "usage"
            rec.output_tokens_disagree = self.stream and streamed != completion
            if not self.stream and rec.chunk_ns:
                rec.chunk_tokens = [completion]
        elif split is not None and split[1] == "tokenizer":
            rec.output_tokens, rec.output_tokens_source = streamed, "tokenizer"
        elif rec.output_tokens_chunks:
            rec.output_tokens, rec.output_tokens_source = rec.output_tokens_chunks, "chunks"
        details = usage.get(self.OUTPUT_DETAILS_KEY)
        reasoning = (
            token_count(details.get("reasoning_tokens")) if isinstance(details, dict) else None
        )
        if reasoning is not None and (reasoning or not rec.reasoning_chunks):
            rec.reasoning_tokens = (
                reasoning  # the server's count (0 from a model that did not reason)
            )
        elif rec.reasoning_chunks:
            rec.reasoning_tokens = rec.reasoning_chunks
