"""The per-read path of every dialect's stream state, and its fast path: the token frame.

The token events of one stream differ only in their text: the same id, model, index and nulls
around it. ``TokenFrameState`` learns that frame from a read that held exactly one plain token
event (``_learn_frame``), checks it with a probe on a scratch copy of the state
(``_frame_holds``), and from then on takes a read that is the frame around a plain JSON string
without the SSE decode and the JSON parse (the top of ``on_bytes``). Anything else goes the full
way: the SSE decoder and the dialect's ``_event``. Behaviour is the same either way (the tests
compare both paths on every split of generated streams); only the cost differs. The state
also hands the frame to the HTTP reader as ``chunk_frame`` (while its decoder idles), with its
own lists: the raw transport's reader takes a whole chunk in the frame itself, without a call
into the state (``ResponseReader.feed``).

The dialect states (``OpenAIStreamState``, ``AnthropicStreamState``) subclass ``TokenFrameState``
and name where their token text starts (``TEXT_KEYS``). The dialects whose every event is a
JSON object named by its ``type`` (Messages, Responses) subclass ``TypedEventState``, which
checks that shape once for both and hands the dialect the object and its type. ``on_bytes``
is one function, fast path and full way together, because it runs once per read that the
reader does not take: a call more would cost every such chunk.

Example::

    state = OpenAIStreamState(record, "chat", t0_ns=t0)  # a TokenFrameState
    state.on_bytes(b'data: {"choices": [{"delta": {"content": "A"}}]}\\n\\n', now())
    state.on_bytes(b'data: {"choices": [{"delta": {"content": "B"}}]}\\n\\n', now())  # fast
"""

from __future__ import annotations

import functools
import operator
import re
from collections import deque
from collections.abc import Callable
from itertools import repeat
from typing import Any

from loadlab.clients._http1 import ChunkFrame
from loadlab.clients._sse import RawEvent, SSEDecoder, SSELimitError
from loadlab.clients._state import StreamState, loads
from loadlab.records import OUTCOME_PROTOCOL_ERROR, RequestRecord

__all__ = ["TokenFrameState", "TypedEventState"]

_LEARN_TRIES = 3  # token frames learned per stream (see TokenFrameState._learn_frame)
# a JSON string's body that needs no unescaping: no quote, backslash or control character
_plain = re.compile(rb'[^"\\\x00-\x1f]+').fullmatch

_MatchAt = Callable[[bytes, int], "re.Match[bytes] | None"]  # a Pattern's match or fullmatch
_Frame = tuple[bytes, int, _MatchAt, _MatchAt, _MatchAt]  # TokenFrameState._tpl


@functools.lru_cache(maxsize=256)
def _text_then(tail: bytes) -> tuple[re.Pattern[bytes], re.Pattern[bytes], re.Pattern[bytes]]:
    """A JSON string body, then ``tail``: one call matches a token event's text and the rest
    of its frame. Streams of one server share their tails.

    The first pattern's body is bytes that are neither a quote nor a control character: the
    usual text, matched fastest. A quote in the text is escaped (a backslash before it), so
    that body cannot stop there and meet ``tail``, which starts with the string's closing
    quote and runs to the end of the event. The second pattern, tried when the first fails,
    also takes escaped pairs (``\\"``, ``\\\\``), so a text with a quote in it stays on the
    fast way; a lone backslash cannot end its body. A body with a backslash is unescaped by
    the JSON parser, which refuses a bad escape (the read then goes the full way). The
    quantifiers are possessive: giving bytes back could never let ``tail`` match (the byte
    after a body is a quote, or the match is lost), and a body that does not end in ``tail``
    is given up at once, not retried over every split of its text. The third is the first
    with the CRLF that closes an HTTP chunk after ``tail`` (``ResponseReader.feed``)."""
    escaped_tail = re.escape(tail)
    return (
        re.compile(rb'([^"\x00-\x1f]++)' + escaped_tail),
        re.compile(rb'((?:[^"\\\x00-\x1f]++|\\[^\x00-\x1f])++)' + escaped_tail),
        re.compile(rb'([^"\x00-\x1f]++)' + escaped_tail + rb"\r\n"),
    )


def _json_text(raw: bytes) -> str:
    """A JSON string's body, unescaped (ValueError for a bad escape or bytes not UTF-8)."""
    text: str = loads(b'"' + raw + b'"')
    return text


# ``in`` with an int: ``b"\\" in raw`` first tries the bytes as an integer, and makes and drops
# a TypeError (its message formatted) on every chunk
_BACKSLASH = ord("\\")
_SLOTS: dict[type, tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]] = {}


def _slots(cls: type) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]:
    """Every attribute slot of ``cls`` and its bases (the state classes have no ``__dict__``),
    and a getter of all their values at once."""
    found = _SLOTS.get(cls)
    if found is None:
        names = tuple(n for k in cls.__mro__ for n in k.__dict__.get("__slots__", ()))
        found = _SLOTS[cls] = (names, operator.attrgetter(*names) if names else lambda _: ())
    return found


class TokenFrameState(StreamState):
    """``StreamState`` with its per-read path: the learned token frame first, then the full way
    (SSE decode, the dialect's ``_event``)."""

    __slots__ = ("_chunk_tpl", "_fast", "_keys", "_learn", "_tpl", "chunk_frame")

    # how the dialect's token text starts in a raw event (compact and spaced JSON)
    TEXT_KEYS: tuple[bytes, ...] = (b'"content":"', b'"content": "')

    def __init__(self, record: RequestRecord, **kw: Any) -> None:
        super().__init__(record, **kw)  # stream, t0_ns, secrets: StreamState's
        # a token read's frame (_learn_frame): the bytes before the text, their length, and
        # the text-then-tail pattern's fullmatch and match
        self._tpl: _Frame | None = None
        self._fast: _Frame | None = None  # _tpl while the decoder idles
        # the frame as the HTTP reader takes it, whole chunks (ResponseReader.feed), and
        # chunk_frame: _chunk_tpl while the decoder idles (when _fast is set)
        self._chunk_tpl: ChunkFrame | None = None
        self.chunk_frame: ChunkFrame | None = None
        self._learn = _LEARN_TRIES
        self._keys = self.TEXT_KEYS

    def on_bytes(self, data: bytes, t_ns: int) -> bool:
        fast = self._fast
        if fast is not None:  # token events in the stream's learned frame (_learn_frame)
            head, lh, whole, first, quoted = fast
            if data.startswith(head) and (m := whole(data, lh)) is not None:
                # the usual read: one token event (its text, then the frame's tail, then
                # nothing); four calls, the fewest this can take
                raw = m[1]
                try:  # a text with escapes ("\n", "\u00e9") is unescaped by the JSON parser
                    text = loads(b'"' + raw + b'"') if _BACKSLASH in raw else raw.decode()
                except ValueError:
                    pass  # not UTF-8, a bad escape: the full way (and its verdict)
                else:
                    self._stamps.append(t_ns - self._t0)
                    self._parts.append(text)
                    return False
            else:  # several token events in one read (a backlog), maybe more after them
                pos, n = 0, len(data)
                while data.startswith(head, pos) and (
                    (m := first(data, pos + lh)) is not None
                    or (m := quoted(data, pos + lh)) is not None  # a text with a quote
                ):
                    raw = m[1]
                    try:
                        text = loads(b'"' + raw + b'"') if _BACKSLASH in raw else raw.decode()
                    except ValueError:
                        break
                    self._stamps.append(t_ns - self._t0)
                    self._parts.append(text)
                    pos = m.end()
                    if pos == n:
                        return False
                if pos:
                    data = data[pos:]  # the rest, from an event boundary, goes the full way
        if not self._sse:
            return self._keep(data)
        if not self._any_event and len(self._head) < 256:
            self._head = (self._head + data[:256]).lstrip(b"\xef\xbb\xbf\r\n")
        dec = self._decoder
        learning = self._learn and self._tpl is None
        fresh = learning and dec.idle()  # this read starts at an event boundary
        try:  # free unless raised (zero-cost try, Python 3.11+)
            events = dec.feed_raw(data)
        except SSELimitError as exc:  # the transport closes the connection: reading stopped
            return self._set(OUTCOME_PROTOCOL_ERROR, str(exc))
        if events:
            self._any_event = True
            t_rel = t_ns - self._t0
            if len(events) == 1 and self._learn:
                return self._learn_frame(data, events[0], t_rel)
            if fresh:
                return self._learn_each(data, events, t_rel)
            for ev_data, ev_type, _, _ in events:
                if self._event(ev_data, ev_type, t_rel):
                    return True
        self._idle_frame(dec.idle())
        return False

    def _idle_frame(self, idle: bool) -> None:
        """The fast paths' frames, set while the decoder idles (the next read starts an
        event) and the frame is learned, else cleared."""
        if idle and self._tpl is not None:
            self._fast, self.chunk_frame = self._tpl, self._chunk_tpl
        else:
            self._fast = self.chunk_frame = None

    def _learn_each(self, data: bytes, events: list[RawEvent], t_rel: int) -> bool:
        """A read of several whole events, while the frame is not learned yet: each is
        interpreted as if it had come in a read of its own (``_learn_frame``), so that a stream
        read behind its server (a first read holding the head, the role chunk and a few tokens;
        a backlog) still learns its frame and leaves the full way. The read is cut at its blank
        lines; one that does not cut into exactly its events is interpreted without learning.
        """
        raws = data.split(b"\n\n")
        whole = len(raws) == len(events) + 1 and not raws[-1] and b"\r" not in data
        for i, event in enumerate(events):
            if whole and self._learn and self._tpl is None:
                failed = self._learn_frame(raws[i] + b"\n\n", event, t_rel)
            else:
                failed = self._event(event[0], event[1], t_rel)
            if failed:
                return True
        self._idle_frame(self._decoder.idle())
        return False

    def _learn_frame(self, data: bytes, event: RawEvent, t_rel: int) -> bool:
        """Interpret a read that held exactly one event, and learn its frame when it was one
        plain token.

        The token events of one stream differ only in their text: the same id, model, index
        and nulls around it. When a read was exactly one event whose only effect was one
        token with text T, and T appears in the raw bytes unescaped right after one of
        ``TEXT_KEYS``, the bytes before and after it are a candidate frame. It is kept only
        if a probe, the frame around another text, decodes and interprets (on a scratch
        copy of this state) to exactly one token with that text. A later read that is the
        frame around a plain JSON string body (no quote, backslash or control character,
        valid UTF-8) is then the same JSON with another text, and is taken without the SSE
        decode and the JSON parse; anything else goes the full way. A few tries per stream,
        so a server whose frames never repeat costs little."""
        rec = self.record
        n_chunks, n_parts, n_server = len(self._stamps), len(self._parts), len(rec.server)
        finish, usage = rec.finish_reason, self.usage
        failed = self._event(event[0], event[1], t_rel)
        dec = self._decoder
        parts = self._parts
        if (
            not failed
            and len(self._stamps) == n_chunks + 1
            and len(parts) == n_parts + 1
            and type(parts[-1]) is str
            and parts[-1]
            and rec.finish_reason == finish
            and self.usage is usage
            and len(rec.server) == n_server
            and self._outcome is None
            and not self.done
            and dec.idle()
        ):
            self._learn -= 1
            raw = parts[-1].encode()
            if _plain(raw) is not None:
                for key in self._keys:
                    at = data.find(key + raw + b'"')
                    if at >= 0:
                        start = at + len(key)
                        end = start + len(raw)
                        head, tail = data[:start], data[end:]
                        if self._frame_holds(head, tail, event[1]):
                            plain, quoted, chunk = _text_then(tail)
                            self._tpl = (head, start, plain.fullmatch, plain.match, quoted.match)
                            self._chunk_tpl = (head, start, chunk.fullmatch, self._stamps.append,
                                               self._parts.append, self._t0, _json_text,
                                               chunk.match, {})  # fmt: skip
                        break
        self._idle_frame(dec.idle())
        return failed

    def _frame_holds(self, head: bytes, tail: bytes, event_type: str) -> bool:
        """Does ``head + text + tail`` mean one token with ``text``? Asked of a scratch copy
        of this state, so that nothing here is touched."""
        probe = "loadlab~probe"
        events = SSEDecoder().feed_raw(head + probe.encode() + tail)
        if len(events) != 1 or events[0][1] != event_type:
            return False
        cls = type(self)
        scratch = cls.__new__(cls)  # a shallow copy (copy.copy costs twice as much)
        names, values = _slots(cls)
        try:  # every slot in one pass of C (a loop here cost a hundred lines a stream)
            deque(map(setattr, repeat(scratch), names, values(self)), maxlen=0)
        except AttributeError:  # a slot this state never set
            for name in names:
                if hasattr(self, name):
                    setattr(scratch, name, getattr(self, name))
        if hasattr(self, "__dict__"):  # a subclass without __slots__
            scratch.__dict__.update(self.__dict__)
        scratch.record = RequestRecord(self.record.request_id)
        scratch._stamps, scratch._parts = [], []
        scratch._outcome, scratch.done, scratch.usage = None, False, self.usage
        failed = scratch._event(events[0][0], event_type, 0)
        return (
            not failed
            and scratch._parts == [probe]
            and len(scratch._stamps) == 1
            and scratch._outcome is None
            and not scratch.done
            and scratch.record.finish_reason is None
            and not scratch.record.server
            and scratch.usage is self.usage
        )


class TypedEventState(TokenFrameState):
    """``TokenFrameState`` for the dialects whose every event is a JSON object named by its
    ``type`` field (Anthropic Messages, OpenAI Responses): ``_event`` parses it and turns an
    event of the wrong shape (a missing key, a list where an object belongs) into a protocol
    error; the dialect's ``_typed`` reads the event."""

    __slots__ = ()

    def _event(self, data: str, event: str, t_rel: int) -> bool:
        """One SSE event; True when it decided a failure."""
        obj = self._json_event(data)
        if obj is None:
            return True
        try:  # free unless raised (zero-cost try, Python 3.11+)
            return self._typed(obj, obj.get("type"), event, data, t_rel)
        except (AttributeError, KeyError, TypeError):
            return self._set(OUTCOME_PROTOCOL_ERROR, "unexpected event shape: " + data)

    def _typed(  # pragma: no cover
        self, obj: dict[str, Any], kind: Any, event: str, data: str, t_rel: int
    ) -> bool:
        """One event's JSON object and its ``type`` (``event``: the SSE event line; ``data``:
        the raw text, for error messages); True when it decided a failure."""
        raise NotImplementedError
