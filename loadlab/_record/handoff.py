"""The proxy's side of the trace writer: hand each finished request to the child process that
writes its trace line (``loadlab._record.tracer``), at the cost of one pipe write.

``request_frame`` packs a request's body as it came, its times and what its stream's watch
counted into one frame (a small JSON header with the token times, then the body: nothing is
pickled, the body is not parsed), and ``TraceChild.put`` writes it to the child's stdin through
the event loop's pipe transport, which never blocks. The child answers with its
counts after each batch it wrote; a request that would put more than ``max_pending`` requests
(or ``MAX_BUFFERED`` bytes that the pipe has not taken) in flight is not handed over but
counted as dropped, so a child that falls behind costs trace lines, never forwarding. A child
that dies is said once on stderr; the traffic goes on and every request from then on (and those
it had not written) is counted as not traced. ``stop`` ends the child's input and waits for it
to write what it has (``STOP_DRAIN_S`` at most, then it is killed).

Example::

    child = TraceChild(Path("trace.jsonl"), {"unit": "chars", "block": 16})
    await child.start()
    if child.accepts():
        child.put(request_frame("chat", body, arrival_ns, sent_ns, end_ns, watch, "ok", 200))
    await child.stop()
    child.written, child.lost, child.why()
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from loadlab._record.stream import StreamWatch
from loadlab._record.tracer import FRAME
from loadlab.errors import ConfigError

__all__ = ["MAX_PENDING", "STOP_DRAIN_S", "TraceChild", "request_frame"]

MAX_PENDING = 16_384  # requests handed over and not yet written
MAX_BUFFERED = 64 << 20  # bytes of them the proxy holds (what the pipe has not taken)
STOP_DRAIN_S = 5.0  # how long ``stop`` waits for the child to write what it has
START_S = 60.0  # how long the child may take to start (a tokenizer to load)
PIPE_SIZE = 1 << 20  # the pipe's buffer, where Linux allows it (F_SETPIPE_SZ)


def request_frame(
    api: str,
    body: bytes,
    arrival_ns: int,
    sent_ns: int,
    end_ns: int,
    watch: StreamWatch | None,
    outcome: str,
    status: int,
) -> bytes:
    """One finished request as the child reads it (``Tracer.frame_line``)."""
    watched: list[Any] | None = None
    if watch is not None:
        u = watch.usage
        watched = [u.prompt_tokens, u.output_tokens, u.cached_tokens, u.reasoning_tokens,
                   watch.reply_chars, watch.called_tool, watch.token_times_ns]  # fmt: skip
    meta = orjson.dumps((api, outcome, status, arrival_ns, sent_ns, end_ns, watched))
    return b"".join((FRAME.pack(len(meta), len(body)), meta, body))


class _Acks(asyncio.Protocol):
    """The child's stdout: a JSON line of counts after each batch."""

    def __init__(self, child: TraceChild) -> None:
        self.child = child
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        *lines, self.buf = (self.buf + data).split(b"\n")
        for line in lines:
            with contextlib.suppress(orjson.JSONDecodeError):
                self.child.counted(orjson.loads(line))

    def connection_lost(self, exc: Exception | None) -> None:
        self.child.gone()


class _Input(asyncio.Protocol):
    """The child's stdin (a write pipe): a broken pipe is a child that died."""

    def __init__(self, child: TraceChild) -> None:
        self.child = child

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self.child.gone()


class TraceChild:
    def __init__(
        self,
        path: Path,
        header: dict[str, Any],
        *,
        block: int = 16,
        tokenizer: str | None = None,
        salt: bytes | None = None,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.config = {"path": str(path), "header": header, "block": block, "tokenizer": tokenizer}
        self._salt = salt or b""  # empty: the child makes its own, never written anywhere
        self.max_pending = max_pending
        self.sent = 0  # requests handed over
        self.done = 0  # ... that the child has written (or found untraceable)
        self.written = 0
        self.failed = 0  # lines whose write failed (a full disk)
        self.dropped = 0  # requests not handed over: the child was behind
        self.untraced = 0  # requests the child could not write: it died
        self.last_error = ""
        self.died = ""  # how the child ended, when it ended before ``stop``
        self.pid = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._input: asyncio.WriteTransport | None = None
        self._ready: asyncio.Future[str] | None = None
        self._ended: asyncio.Future[None] | None = None
        self._stopping = False

    @property
    def lost(self) -> int:
        return self.failed + self.dropped + self.untraced

    def why(self) -> str:
        """Why trace lines were lost, in words ("" when none was)."""
        parts = []
        if self.failed:
            parts.append(self.last_error or "write failed")
        if self.dropped:
            parts.append(f"{self.dropped} dropped: the trace writer fell behind")
        if self.untraced:
            parts.append(f"{self.untraced} not traced: the trace writer {self.died}")
        return "; ".join(parts)

    async def start(self) -> None:
        """Starts the child and waits until its trace file is open (``ConfigError`` if not)."""
        loop = asyncio.get_running_loop()
        self._proc = proc = subprocess.Popen(  # noqa: S603 - this interpreter, fixed args
            [sys.executable, "-m", "loadlab._record.tracer", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
        )  # fmt: skip
        self.pid = proc.pid
        if proc.stdin is None or proc.stdout is None:  # pragma: no cover - both are pipes
            raise RuntimeError("the trace writer's pipes were not made")
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, PIPE_SIZE)  # type: ignore[attr-defined]
        self._ready, self._ended = loop.create_future(), loop.create_future()
        self._input, _ = await loop.connect_write_pipe(lambda: _Input(self), proc.stdin)
        await loop.connect_read_pipe(lambda: _Acks(self), proc.stdout)
        meta = orjson.dumps(self.config)
        self._input.write(FRAME.pack(len(meta), len(self._salt)) + meta + self._salt)
        try:
            error = await asyncio.wait_for(asyncio.shield(self._ready), START_S)
        except TimeoutError:
            error = f"did not start within {START_S:.0f} s"
        if error:
            self._stopping = True
            self._kill()
            raise ConfigError(f"the trace writer cannot start: {error}")

    def accepts(self) -> bool:
        """Whether a finished request can be handed over now; if not, it is counted (dropped:
        the child is behind; not traced: the child died) and its frame is never made."""
        if self.died or self._input is None or self._input.is_closing():
            self.untraced += 1
            return False
        if (
            self.sent - self.done >= self.max_pending
            or self._input.get_write_buffer_size() > MAX_BUFFERED
        ):
            self.dropped += 1
            return False
        return True

    def put(self, frame: bytes) -> None:
        """Hands one finished request over (``request_frame``), after ``accepts``."""
        if self._input is not None:
            self._input.write(frame)
            self.sent += 1

    def counted(self, counts: dict[str, Any]) -> None:
        if self._ready is not None and not self._ready.done():
            if "ready" in counts or ("error" in counts and "done" not in counts):
                self._ready.set_result(counts.get("error") or "")
                return
        self.done = int(counts.get("done", self.done))
        self.written = int(counts.get("written", self.written))
        self.failed = int(counts.get("failed", self.failed))
        self.last_error = str(counts.get("error") or self.last_error)

    def gone(self) -> None:
        """The child's pipes closed: at ``stop``, its end; else it died."""
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)
        if self._ready is not None and not self._ready.done():
            self._ready.set_result("it exited")
            return
        if self._stopping or self.died:
            return
        self.died = self._how_ended()
        self.untraced += self.sent - self.done
        self.done = self.sent
        print(
            f"loadlab record: the trace writer {self.died}; traffic still passes through, "
            "requests from now on are not traced",
            file=sys.stderr,
            flush=True,
        )

    def _how_ended(self) -> str:
        code = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._proc.wait(0.1)  # its pipes closed as it exited: at once, once
        if code is None:
            return "stopped answering"
        return f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"

    async def stop(self) -> None:
        """Ends the child's input and waits (``STOP_DRAIN_S`` at most) for it to write all."""
        self._stopping = True
        if self._input is not None:
            self._input.close()  # what is buffered goes first
        deadline = time.monotonic() + STOP_DRAIN_S
        if self._ended is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._ended), STOP_DRAIN_S)
        proc = self._proc
        while proc is not None and proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if proc is not None and proc.poll() is None:
            self._kill()
            self.died = self.died or f"did not finish within {STOP_DRAIN_S:.0f} s"
        elif proc is not None and proc.returncode != 0 and not self.died:
            self.died = self._how_ended()
        self.untraced += self.sent - self.done
        self.done = self.sent

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
