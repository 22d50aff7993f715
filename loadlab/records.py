"""The one record type that flows through the harness.

``RequestSpec`` is what a workload asks for; ``RequestRecord`` is what happened. Every metric
is a pure function of records (``loadlab._analysis.metrics``). Timestamps are raw integers from
``time.perf_counter_ns()`` made relative to the run's ``t0_ns`` (so the results file is
portable); durations are differences of them. Wall-clock time is only a label
(``Results.started_at``).

Outcome classes (the ``OUTCOME_*`` constants; ``http_outcome`` names the HTTP ones)::

    ok                  the stream completed ([DONE] or a finish_reason, then EOF)
    http_<status>       a non-2xx status (http_429, http_500, ...)
    connect_error       the connection could not be made, or was reset before a response
    timeout             no byte for longer than the read timeout, or past the total timeout
    protocol_error      a malformed stream or body (bad JSON in an event, bad framing)
    stream_error        an error payload inside a 200 stream
    incomplete          the stream ended (EOF, reset) before completion
    cancelled           the run stopped while the request was in flight
    dropped             never sent (in-flight cap reached, or too late for its schedule)
    bad_input           never sent: the workload could not build it (a dataset row whose
                        image or audio cannot be read); a failure, and the run goes on

Invariants: scheduled = sent + dropped; sent = ok + failed (every non-ok, non-dropped).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from loadlab.errors import at_least

__all__ = [
    "COUNT_FIELDS",
    "FAILED_OUTCOMES",
    "LEFT_OUT_AT_DEFAULT",
    "OUTCOME_BAD_INPUT",
    "OUTCOME_CANCELLED",
    "OUTCOME_CONNECT_ERROR",
    "OUTCOME_DROPPED",
    "OUTCOME_INCOMPLETE",
    "OUTCOME_OK",
    "OUTCOME_PROTOCOL_ERROR",
    "OUTCOME_STREAM_ERROR",
    "OUTCOME_TIMEOUT",
    "TIME_FIELDS",
    "RequestRecord",
    "RequestSpec",
    "TokenSource",
    "http_outcome",
    "impossible",
    "is_failed",
    "known_outcome",
    "pick",
    "printable",
]

OUTCOME_OK = "ok"
OUTCOME_CONNECT_ERROR = "connect_error"
OUTCOME_TIMEOUT = "timeout"
OUTCOME_PROTOCOL_ERROR = "protocol_error"
OUTCOME_STREAM_ERROR = "stream_error"
OUTCOME_INCOMPLETE = "incomplete"
OUTCOME_CANCELLED = "cancelled"
OUTCOME_DROPPED = "dropped"
OUTCOME_BAD_INPUT = "bad_input"
FAILED_OUTCOMES = frozenset(
    {
        OUTCOME_CONNECT_ERROR,
        OUTCOME_TIMEOUT,
        OUTCOME_PROTOCOL_ERROR,
        OUTCOME_STREAM_ERROR,
        OUTCOME_INCOMPLETE,
        OUTCOME_CANCELLED,
        OUTCOME_BAD_INPUT,
    }
)

# Where a record's output token count came from (docs/clients.md, "What is measured").
TokenSource = Literal["usage", "chunks", "tokenizer", "none"]


# Record fields added after schema v1 that a file leaves out while they are None.
def http_outcome(status: int) -> str:
    """Outcome class of a non-2xx HTTP status: ``http_outcome(429) == "http_429"``."""
    return f"http_{status}"


def is_failed(outcome: str) -> bool:
    """True for every sent request that did not complete (``dropped`` was never sent)."""
    return outcome != OUTCOME_OK and outcome != OUTCOME_DROPPED


_HTTP_OUTCOME = re.compile(r"http_[1-9][0-9][0-9]")


def known_outcome(outcome: object) -> bool:
    """One of the outcome classes above (``http_`` and a three-digit status included)."""
    return isinstance(outcome, str) and (
        outcome in (OUTCOME_OK, OUTCOME_DROPPED)
        or outcome in FAILED_OUTCOMES
        or _HTTP_OUTCOME.fullmatch(outcome) is not None
    )


# What a terminal would act on instead of showing: C0 controls (ESC starts the sequences that
# set a window's title or clear the screen; CR and LF forge lines), DEL, C1 controls (0x9b is a
# one-byte CSI), Unicode line separators and the bidirectional overrides that reorder a line.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    r"""``text`` safe to print: each character a terminal would act on written as its escape
    (``\x1b``, ``\n``, ``\u202e``), so a server's error text can neither run an escape
    sequence nor forge a line. Record text that a server wrote (``error``) holds only this.

    >>> printable("boom\x1b]0;pwned\x07\x1b[2J\nall requests ok")
    'boom\\x1b]0;pwned\\x07\\x1b[2J\\nall requests ok'
    """
    return _UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], text)


@dataclass(frozen=True)
class RequestSpec:
    """One request a workload wants sent.

    ``intended_at_s`` is the offset from the run start at which an open-loop runner must send
    it (``None`` in closed loop, or for a later turn of a chat session, which is sent
    ``think_time_s`` after the previous turn of the same ``session_id`` completed).
    For the chat API the runner sends the session's history (earlier user turns and the
    answers actually received) followed by ``prompt`` as the new user message; for the
    completions API ``prompt`` is sent as is.
    """

    request_id: str
    prompt: str
    max_tokens: int
    intended_at_s: float | None = None
    prompt_tokens: int | None = (
        None  # requested prompt length in tokens, when the workload knows it
    )
    session_id: str | None = None
    turn: int = 0
    think_time_s: float = 0.0
    request_class: str = "default"  # per-class SLOs and reports ("chat", "long_prompt", ...)
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    # An agent's request: the tools it offers (OpenAI chat's ``{"type": "function",
    # "function": {...}}`` form; each dialect sends its own). A ``tool_turn`` answers the
    # previous turn's tool calls, ``prompt`` being each call's result: the runner sends it only
    # when that answer called a tool (else the session is over) and fills in ``tool_results``
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_turn: bool = False
    tool_results: tuple[Mapping[str, Any], ...] = ()
    # A replayed later turn: what the previous answer added to the recorded prompt, in
    # characters (its text or its tool calls' arguments, and the messages' separators); the
    # runner resizes ``prompt`` by the difference with the answer this run got, so the turn's
    # prompt keeps its recorded length (``loadlab.clients._tools.next_turn``)
    answer_chars: int | None = None
    reasoning_effort: str | None = None  # "low" | "medium" | "high", passed to the API
    # Embeddings and rerank (``loadlab.workloads._pooling``): the texts to embed, or the
    # documents to rank against ``prompt`` (the query); nothing is generated
    inputs: tuple[str, ...] = ()
    # Images sent with the new user message: ``data:`` URLs (or http URLs) and each one's
    # (width, height) in pixels, when known (``loadlab.workloads._images``)
    images: tuple[str, ...] = ()
    image_sizes: tuple[tuple[int, int], ...] = ()
    image_tokens: int = (
        0  # what the images add to ``prompt_tokens`` (the text's) as the target counts
    )
    # Audio clips sent with it as (format, base64 data), each one's length in seconds and
    # their tokens as the target counts them (``loadlab.workloads._audio``)
    audio: tuple[tuple[str, str], ...] = ()
    audio_s: tuple[float, ...] = ()
    audio_tokens: int = 0
    # Why the workload could not build this request (a dataset row's unreadable image): the
    # runner records it as ``bad_input`` without sending it
    error: str | None = None

    def new_messages(self) -> list[Mapping[str, Any]]:
        """What this request adds to its session: the tool results, else the user message.

        >>> RequestSpec("r1", "hi", 8).new_messages()
        [{'role': 'user', 'content': 'hi'}]
        """
        if self.tool_results:
            return list(self.tool_results)
        if self.images or self.audio:  # OpenAI chat's content parts (the other dialects convert
            # images); media first, as most multimodal prompts have them, so a repeated one is a
            # shared prefix
            parts: list[dict[str, Any]] = [
                {"type": "image_url", "image_url": {"url": u}} for u in self.images
            ]
            parts += [
                {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}
                for fmt, data in self.audio
            ]
            return [{"role": "user", "content": [*parts, {"type": "text", "text": self.prompt}]}]
        return [{"role": "user", "content": self.prompt}]

    # Leading prompt tokens shared with an earlier request of the same workload (a prefix
    # cache could serve them): what the expected hit rate is computed from. None: not known.
    shared_prefix_tokens: int | None = None

    def __post_init__(self) -> None:
        # embeddings and rerank generate nothing (max_tokens 0); every other request >= 1
        at_least("max_tokens", self.max_tokens, 0 if self.inputs else 1, f" ({self.request_id})")
        if self.intended_at_s is not None and self.intended_at_s < 0:
            raise ValueError(
                f"intended_at_s must be >= 0 (an offset from the run start), "
                f"got {self.intended_at_s} ({self.request_id})"
            )
        at_least("think_time_s", self.think_time_s, 0)
        at_least("turn", self.turn, 0)


@dataclass
class RequestRecord:
    """What happened to one request. Times are ns relative to the run's ``t0_ns``.

    ``chunk_ns`` holds the read time of every *token-carrying* chunk (answer content,
    reasoning or tool-call arguments; a role-only or empty chunk, a usage-only chunk and
    ``[DONE]`` are not in it); ``answer_ns`` the first that carried answer content (reasoning
    and tool-call arguments are not answer content); ``chunk_tokens`` the number of
    tokens each carried when known (1 per chunk otherwise). ``end_ns`` is when the response
    ended (EOF or ``[DONE]``), which is *not* the E2E end (that is ``chunk_ns[-1]``).
    """

    request_id: str
    outcome: str = OUTCOME_OK
    session_id: str | None = None
    turn: int = 0
    request_class: str = "default"
    worker: int = 0
    endpoint: str = ""  # a label (e.g. "vendorA"), never a URL with credentials
    intended_ns: int | None = None
    sent_ns: int | None = None
    headers_ns: int | None = None  # response status line and headers received
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    end_ns: int | None = None
    http_status: int | None = None
    error: str | None = None  # short, human-readable; never contains secrets
    prompt_tokens_requested: int | None = None
    prompt_tokens: int | None = None  # from the server's usage when reported
    # Of prompt_tokens, those the server served from its prefix cache (OpenAI
    # usage.prompt_tokens_details.cached_tokens; Anthropic cache_read_input_tokens). None:
    # the server did not say.
    cached_prompt_tokens: int | None = None
    shared_prefix_tokens: int | None = None  # from the spec: see RequestSpec
    max_tokens: int | None = None
    output_tokens: int | None = None
    output_tokens_source: TokenSource = "none"
    output_tokens_chunks: int = 0  # token-carrying chunks seen (for the disagreement flag)
    output_tokens_disagree: bool = False
    finish_reason: str | None = None
    late: bool = False  # open loop: sent more than the lateness tolerance after intended_ns
    server: dict[str, Any] = field(default_factory=dict)  # e.g. kv_transfer_bytes from the server
    # Reasoning models and tool calls (ARCHITECTURE.md: TTFAT, reasoning and tool-call tokens).
    # A results file leaves these out while they hold their defaults (``to_dict``), so files
    # of runs without them read and write back as before.
    response_id: str | None = None  # the server's id: the stream's ``id``, else a header's
    answer_ns: int | None = None  # first chunk carrying answer content (TTFAT's end)
    reasoning_chunks: int = 0  # token chunks that carried reasoning (they are in chunk_ns)
    reasoning_start_ns: int | None = None  # first and last reasoning chunk
    reasoning_end_ns: int | None = None
    reasoning_tokens: int | None = None  # usage's reasoning_tokens, else reasoning_chunks
    tool_call_chunks: int = 0  # chunks of tool-call arguments (in chunk_ns: output tokens)
    tool_calls: int = 0  # tool calls in the answer
    inputs: int | None = None  # embeddings / rerank: the texts sent (no chunks, no TTFT)
    images: int | None = None  # images sent with the request, and their pixels in all
    image_pixels: int | None = None
    audio_clips: int | None = None  # audio clips sent with the request, and their length in all
    audio_ms: int | None = None
    # False: asked without streaming; its one "chunk" is the whole body, so it has an E2E
    # latency but no TTFT, ITL or TPOT (those are absent, never zero)
    streamed: bool = True
    # the sending machine's name, in a run spread over machines (``worker`` is its index)
    host: str | None = None

    @classmethod
    def for_spec(cls, spec: RequestSpec, **fields: Any) -> RequestRecord:
        """A record that carries ``spec``'s identity and requested lengths, plus ``fields``.

        >>> RequestRecord.for_spec(RequestSpec("r1", "hi", 8), endpoint="a").max_tokens
        8
        """
        return cls(
            request_id=spec.request_id,
            session_id=spec.session_id,
            turn=spec.turn,
            request_class=spec.request_class,
            prompt_tokens_requested=(
                spec.prompt_tokens + spec.image_tokens + spec.audio_tokens
                if spec.prompt_tokens is not None
                else None
            ),
            max_tokens=spec.max_tokens,
            shared_prefix_tokens=spec.shared_prefix_tokens,
            inputs=len(spec.inputs) if spec.inputs else None,
            images=len(spec.images) if spec.images else None,
            image_pixels=sum(w * h for w, h in spec.image_sizes) if spec.image_sizes else None,
            audio_clips=len(spec.audio) if spec.audio else None,
            audio_ms=round(sum(spec.audio_s) * 1000) if spec.audio_s else None,
            **fields,
        )

    @property
    def ok(self) -> bool:
        return self.outcome == OUTCOME_OK

    @property
    def failed(self) -> bool:
        return is_failed(self.outcome)

    def to_dict(self) -> dict[str, Any]:
        """The record as plain data, fields in declaration order, the later fields left out
        while they hold their defaults (``LEFT_OUT_AT_DEFAULT``); lists and ``server`` are
        copies. Every finished record is serialised while the run goes on (the journal), so
        this is written out by hand: ``dataclasses.asdict`` deep-copies each timestamp, about
        two thousand calls for a record of 128 chunks."""
        d = self.__dict__
        out = {name: d[name] for name in _FIELD_NAMES}
        out["chunk_ns"] = list(self.chunk_ns)
        out["chunk_tokens"] = list(self.chunk_tokens)
        out["server"] = {
            k: v if type(v) in _SCALARS else copy.deepcopy(v) for k, v in self.server.items()
        }
        for name in LEFT_OUT_AT_DEFAULT:
            if out[name] == _DEFAULTS[name]:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestRecord:
        """A record read back; raises ``ValueError`` naming the field that is missing or of the
        wrong type (a record holding only ``request_id`` is not an ``ok`` request)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a record must be an object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(
                f"unknown record fields {sorted(unknown)}; is the file from a newer loadlab?"
            )
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            rid = data.get("request_id", "?")
            raise ValueError(f"record {rid!r} has no {', '.join(missing)}")
        for key, value in data.items():
            kind = _FIELD_TYPES.get(key)
            if kind is not None and not _is(value, kind):
                raise ValueError(
                    f"record {data.get('request_id')!r}: field {key!r} must be {kind}, "
                    f"got {value!r:.40}"
                )
        record = cls(**dict(data))
        why = impossible(record)
        if why is not None:
            raise ValueError(why)
        return record


# What a record read back may not hold (``impossible``): a negative count, a time after a later
# one, a time outside its run. Times are ns from the run's start; counts are whole tokens.
COUNT_FIELDS = (
    "turn", "worker", "http_status", "prompt_tokens_requested", "prompt_tokens",
    "cached_prompt_tokens", "shared_prefix_tokens", "max_tokens", "output_tokens",
    "output_tokens_chunks", "reasoning_chunks", "reasoning_tokens", "tool_call_chunks",
    "tool_calls", "inputs", "images", "image_pixels", "audio_clips", "audio_ms",
)  # fmt: skip
TIME_FIELDS = ("intended_ns", "sent_ns", "headers_ns", "end_ns", "answer_ns",
               "reasoning_start_ns", "reasoning_end_ns")  # fmt: skip
# (earlier, later): the later may not come before the earlier
_ORDER = (("sent_ns", "end_ns"), ("sent_ns", "first chunk"), ("last chunk", "end_ns"),
          ("sent_ns", "headers_ns"))  # fmt: skip


def impossible(r: RequestRecord, bounds: tuple[int, int] | None = None) -> str | None:
    """Why record ``r`` cannot be a record loadlab wrote, or None: an unknown outcome, a
    negative count, a time before an earlier one (an end before the send), chunk times that
    go back, or with ``bounds`` a time outside [lo, hi] ns (the run's span).

    >>> impossible(RequestRecord("r1", sent_ns=5, end_ns=2))
    "record 'r1': end_ns 2 is before sent_ns 5"
    """
    rid = f"record {r.request_id!r}"
    if not known_outcome(r.outcome):
        return f"{rid}: unknown outcome {r.outcome!r}; is the file from a newer loadlab?"
    for name in COUNT_FIELDS:
        value = getattr(r, name)
        if value is not None and value < 0:
            return f"{rid}: {name} is {value}; a count is never negative"
    if any(c < 0 for c in r.chunk_tokens):
        return f"{rid}: chunk_tokens holds {min(r.chunk_tokens)}; a count is never negative"
    c = r.chunk_ns
    if any(b < a for a, b in itertools.pairwise(c)):
        return f"{rid}: chunk_ns goes back in time; chunks are read one after another"
    times = {name: getattr(r, name) for name in TIME_FIELDS}
    times.update({"first chunk": c[0] if c else None, "last chunk": c[-1] if c else None})
    if bounds is not None:
        lo, hi = bounds
        for name, t in times.items():
            if t is not None and not lo <= t <= hi:
                return (
                    f"{rid}: {name} {t:,} ns lies outside its run ({lo / 1e9:g} to {hi / 1e9:g} s); "
                    "the file is damaged or was edited"
                )
    for early, late in _ORDER:
        a, b = times[early], times[late]
        if a is not None and b is not None and b < a:
            return f"{rid}: {late} {b} is before {early} {a}"
    return None


# fields added after results schema 1's first files: written only when they say something
LEFT_OUT_AT_DEFAULT = (
    "response_id",
    "answer_ns",
    "reasoning_chunks",
    "reasoning_start_ns",
    "reasoning_end_ns",
    "reasoning_tokens",
    "tool_call_chunks",
    "tool_calls",
    "cached_prompt_tokens",
    "shared_prefix_tokens",
    "inputs",
    "images",
    "image_pixels",
    "audio_clips",
    "audio_ms",
    "streamed",
    "host",
)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RequestRecord)}
_FIELD_NAMES = tuple(_DEFAULTS)
_SCALARS = frozenset((str, int, float, bool, type(None)))

# What a record read back must hold, and the JSON type of each field (``from_dict``).
_REQUIRED = ("request_id", "outcome")
_FIELD_TYPES = {
    "request_id": "str",
    "outcome": "str",
    "session_id": "str?",
    "turn": "int",
    "request_class": "str",
    "worker": "int",
    "endpoint": "str",
    "intended_ns": "int?",
    "sent_ns": "int?",
    "headers_ns": "int?",
    "chunk_ns": "list[int]",
    "chunk_tokens": "list[int]",
    "end_ns": "int?",
    "http_status": "int?",
    "error": "str?",
    "prompt_tokens_requested": "int?",
    "prompt_tokens": "int?",
    "max_tokens": "int?",
    "output_tokens": "int?",
    "output_tokens_source": "str",
    "output_tokens_chunks": "int",
    "output_tokens_disagree": "bool",
    "finish_reason": "str?",
    "late": "bool",
    "server": "object",
    "cached_prompt_tokens": "int?",
    "shared_prefix_tokens": "int?",
    "response_id": "str?",
    "answer_ns": "int?",
    "reasoning_chunks": "int",
    "reasoning_start_ns": "int?",
    "reasoning_end_ns": "int?",
    "reasoning_tokens": "int?",
    "tool_call_chunks": "int",
    "tool_calls": "int",
    "inputs": "int?",
    "images": "int?",
    "image_pixels": "int?",
    "audio_clips": "int?",
    "audio_ms": "int?",
    "streamed": "bool",
    "host": "str?",
}


def _is(value: Any, kind: str) -> bool:
    if kind.endswith("?"):
        return value is None or _is(value, kind[:-1])
    if kind == "int":
        return type(value) is int
    if kind == "str":
        return type(value) is str
    if kind == "bool":
        return type(value) is bool
    if kind == "object":
        return isinstance(value, dict)
    # list[int]: every element an int (timestamps and token counts)
    return type(value) is list and all(type(x) is int for x in value)


# Plain data for the JSON files loadlab writes: a record's attributes by name, in order.


def pick(obj: object, names: str) -> dict[str, Any]:
    """``{name: obj.name}`` for each space-separated name, in the order given; a value with a
    ``to_dict`` of its own (a nested summary) is given as that dict.

    >>> from types import SimpleNamespace
    >>> pick(SimpleNamespace(a=1, b="x", c=None), "b a")
    {'b': 'x', 'a': 1}
    >>> pick(SimpleNamespace(n=2, inner=SimpleNamespace(to_dict=lambda: {"p50": 1.5})), "n inner")
    {'n': 2, 'inner': {'p50': 1.5}}
    """
    return {name: _plain(getattr(obj, name)) for name in names.split()}


def _plain(value: Any) -> Any:
    to_dict = getattr(value, "to_dict", None)
    return to_dict() if callable(to_dict) else value
