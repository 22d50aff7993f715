"""The trace writer: a child process of ``loadlab record`` that turns finished requests into
trace lines, so that the proxy's event loop only forwards.

The proxy (``loadlab._record.handoff.TraceChild``) starts it as
``python -m loadlab._record.tracer`` and writes to its stdin one frame per finished request:
the request's body as it came, its times, what the stream's watch counted (usage, token
times, reply length), its outcome and status. This process, at a lower priority (nice 10: the
traffic comes first, the trace may lag), reads each request's shape (``RequestShape``: block
hashes with the trace's salt, which is made here or handed over once in the first frame and
never written), finds the earlier request it continues and writes its line exactly as
``docs/record.md`` lists them. After each batch it answers on stdout with a JSON line of its
counts (requests done, lines written, lines whose write failed and why), which the proxy uses
to bound what is in flight and to print its summary. It ends at the end of its stdin, when it
has written what it got, or at once when the proxy dies (``stop_parent_death``); a stop signal
while the proxy lives is left to the proxy, which ends this process's input when it stops.

A frame: ``<II`` (the sizes of its two parts, little-endian), a JSON header (with the token
times) and the body. The first frame's header is the configuration (the trace
file, its header line, the block size, the tokenizer) and its body the salt (empty: make one).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import struct
import sys
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from loadlab._record.shape import RequestShape, Tokenize
from loadlab._record.tracefile import TraceWriter

__all__ = ["FRAME", "Answered", "Tracer", "frames", "main"]

FRAME = struct.Struct("<II")
CONTINUATIONS_KEPT = 200_000  # conversations remembered to find a request's previous turn
READ_SIZE = 1 << 20


class Answered(NamedTuple):
    """What the proxy's stream watch saw of one answer (never its text)."""

    prompt_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    reasoning_tokens: int | None
    reply_chars: int
    called_tool: bool
    token_times_ns: Sequence[int]


class _Turn(NamedTuple):
    """A conversation's last request, remembered to find its next turn. A tuple of ints: the
    collector stops tracking it, so a full collection never walks the remembered turns."""

    line_id: int  # its trace line's ``id``
    session: int
    turn: int
    end_ns: int


class Tracer:
    """Trace lines, one per finished request, in the order the requests finished."""

    def __init__(self, salt: bytes, block: int = 16, tokenize: Tokenize | None = None) -> None:
        self.salt = salt  # never written anywhere
        self.block = block
        self.tokenize = tokenize
        self._turns: OrderedDict[bytes, _Turn] = OrderedDict()
        self._count = 0
        self._sessions = 0
        self._t0_ns: int | None = None
        self._failed_once = False

    def line(
        self,
        api: str,
        body: dict[str, Any],
        arrival_ns: int,
        sent_ns: int,
        end_ns: int,
        answered: Answered | None,
        outcome: str,
        status: int,
    ) -> dict[str, Any] | None:
        """One request's trace line, its shape read after its answer ended (``end_ns``); None
        for a body whose shape cannot be read (not traced)."""
        try:
            shape = RequestShape.of(
                api, body, salt=self.salt, block=self.block, tokenize=self.tokenize
            )
        except (TypeError, ValueError, AttributeError):
            return None
        if self._t0_ns is None:
            self._t0_ns = arrival_ns
        index = self._count
        self._count += 1
        prev = self._continues(shape)
        if prev is None:
            session, turn, new_from = self._sessions, 0, 0
            self._sessions += 1
        else:
            (j, before) = prev
            session, turn, new_from = before.session, before.turn + 1, j
        chain = shape.message_chain
        if chain:
            self._turns[chain[-1]] = _Turn(index, session, turn, end_ns)
            self._turns.move_to_end(chain[-1])
            while len(self._turns) > CONTINUATIONS_KEPT:
                self._turns.popitem(last=False)
        line = _line(shape, answered, outcome, status)
        line.update(
            id=index,
            timestamp=round((arrival_ns - self._t0_ns) / 1e6, 3),
            session=session,
            turn=turn,
            continues=None if prev is None else prev[1].line_id,
            think_ms=None if prev is None else round((arrival_ns - prev[1].end_ns) / 1e6, 3),
            new_length=_new_length(shape, new_from),
            new_kind=_new_kind(shape, new_from),
            proxy_ms=round((sent_ns - arrival_ns) / 1e6, 3),
        )
        line.update(_latencies(answered, sent_ns, end_ns))
        return line

    def _continues(self, shape: RequestShape) -> tuple[int, _Turn] | None:
        """The earlier request whose messages this one repeats and adds to (the longest)."""
        chain = shape.message_chain
        for j in range(len(chain) - 1, 0, -1):
            found = self._turns.get(chain[j - 1])
            if found is not None:
                return j, found
        return None

    def frame_line(self, meta: bytes, body: bytes) -> dict[str, Any] | None:
        """The line of one request's frame (``loadlab._record.handoff.request_frame``)."""
        api, outcome, status, arrival_ns, sent_ns, end_ns, watched = orjson.loads(meta)
        answered = None if watched is None else Answered(*watched)
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(obj, dict):
            return None
        return self.line(api, obj, arrival_ns, sent_ns, end_ns, answered, outcome, status)

    def safe_line(self, frame: tuple[bytes, bytes]) -> dict[str, Any] | None:
        """``frame_line``, or None for a request it fails on (a tokenizer's own error, say):
        that request is not traced, and the next ones are."""
        try:
            return self.frame_line(*frame)
        except Exception as exc:  # one request's line lost, never the writer
            if not self._failed_once:
                self._failed_once = True
                print(
                    f"loadlab record: a request could not be traced ({type(exc).__name__}); "
                    "it and any other such request are left out of the trace",
                    file=sys.stderr,
                    flush=True,
                )
            return None


def _new_length(shape: RequestShape, start: int) -> int:
    """What a request adds to the one it continues: its messages after the repeated ones, less
    the earlier answer (the first assistant messages), in the trace's unit."""
    lengths = shape.message_lengths[start:]
    roles = shape.message_roles[start:]
    i = 0
    while start and i < len(roles) and roles[i] == "assistant":
        i += 1
    return sum(lengths[i:])


def _new_kind(shape: RequestShape, start: int) -> str:
    """``tool`` when what a request adds is tool results (an agent's next step), else ``user``."""
    return "tool" if "tool" in shape.message_roles[start:] and start else "user"


def _line(
    shape: RequestShape, answered: Answered | None, outcome: str, status: int
) -> dict[str, Any]:
    a = answered
    return {
        "input_length": a.prompt_tokens if a else None,
        "output_length": a.output_tokens if a else None,
        "hash_ids": shape.hash_ids,
        "api": shape.api,
        "model": shape.model,
        "stream": shape.stream,
        "max_tokens": shape.max_tokens,
        "params": shape.params,
        "status": status,
        "outcome": outcome,
        "cached_tokens": a.cached_tokens if a else None,
        "reasoning_tokens": a.reasoning_tokens if a else None,
        "prompt_length": shape.prompt_length,
        "messages": shape.roles,
        "tools": shape.tools,
        "tools_length": shape.tools_length,
        "tool_calls": shape.tool_calls,
        "images": shape.images,
        "images_unsized": shape.images_unsized,
        "reply_length": a.reply_chars if a else 0,
        "answer_tool_call": a.called_tool if a else False,
        "tool_choice": shape.tool_choice,
        "chunks": len(a.token_times_ns) if a else 0,
    }


def _latencies(answered: Answered | None, sent_ns: int, end_ns: int) -> dict[str, Any]:
    """TTFT, ITL (p50 and max) and E2E as the proxy saw them, in ms from its send upstream."""
    times = answered.token_times_ns if answered is not None else []
    if not times:
        return {
            "ttft_ms": None,
            "itl_ms_p50": None,
            "itl_ms_max": None,
            "e2e_ms": round((end_ns - sent_ns) / 1e6, 3),
        }
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    return {
        "ttft_ms": round((times[0] - sent_ns) / 1e6, 3),
        "itl_ms_p50": round(gaps[len(gaps) // 2] / 1e6, 3) if gaps else None,
        "itl_ms_max": round(gaps[-1] / 1e6, 3) if gaps else None,
        "e2e_ms": round((times[-1] - sent_ns) / 1e6, 3),
    }


def frames(fd: int) -> Iterator[list[tuple[bytes, bytes]]]:
    """The frames read from ``fd``, a batch per read (all the whole frames it completed),
    until its end."""
    buf = bytearray()
    while True:
        chunk = os.read(fd, READ_SIZE)
        if not chunk:
            return
        buf += chunk
        batch, pos = [], 0
        while len(buf) - pos >= FRAME.size:
            a, b = FRAME.unpack_from(buf, pos)
            start, end = pos + FRAME.size, pos + FRAME.size + a + b
            if end > len(buf):
                break
            batch.append((bytes(buf[start : start + a]), bytes(buf[start + a : end])))
            pos = end
        del buf[:pos]
        if batch:
            yield batch


_ACKS = [1]  # the proxy's pipe; fd 1 itself is pointed at stderr (``main``)


def _say(counts: dict[str, Any]) -> None:
    os.write(_ACKS[0], orjson.dumps(counts) + b"\n")


def _writer_and_tracer(config: dict[str, Any], salt: bytes) -> tuple[TraceWriter, Tracer]:
    tokenize = None
    if config.get("tokenizer"):
        from loadlab.workloads._tokenizers import load_tokenizer

        tokenize = load_tokenizer(config["tokenizer"]).encode
    writer = TraceWriter(Path(config["path"]), config["header"])
    tracer = Tracer(salt or os.urandom(32), int(config["block"]), tokenize)
    return writer, tracer


def main() -> int:
    from loadlab._runner.signals import stop_parent_death

    parent = int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid()
    stop_parent_death()  # dies with the proxy, even one killed
    if os.getppid() != parent:  # it died before that was asked
        return 1

    def stop_signal(signum: int, frame: object) -> None:
        # a Ctrl-C or a SIGTERM for the whole group (a service manager's stop) reaches this
        # process too: the proxy ends its input once it has stopped forwarding, and this one
        # writes what it got then; only a proxy that died ends it at once
        if os.getppid() != parent:
            raise SystemExit(1)

    signal.signal(signal.SIGINT, stop_signal)
    signal.signal(signal.SIGTERM, stop_signal)
    with contextlib.suppress(OSError):
        os.nice(10)
    _ACKS[0] = os.dup(1)  # what a library prints goes to stderr, never into the counts
    os.dup2(2, 1)
    batches = frames(0)
    first = next(batches, None)
    if not first:
        return 2
    meta, salt = first[0]
    try:
        writer, tracer = _writer_and_tracer(orjson.loads(meta), salt)
        writer.open()
    except Exception as exc:  # a tokenizer or a file that cannot be opened: the proxy says why
        _say({"error": str(exc)})
        return 2
    _say({"ready": True})
    done = 0
    for batch in itertools.chain([first[1:]], batches):
        lines = [x for x in map(tracer.safe_line, batch) if x is not None]
        writer.write(lines)
        done += len(batch)
        _say({"done": done, "written": writer.written, "failed": writer.failed,
              "error": writer.last_error})  # fmt: skip
    writer.close()
    _say({"done": done, "written": writer.written, "failed": writer.failed,
          "error": writer.last_error, "end": True})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
