"""The trace file ``loadlab record`` writes: a header line, then one JSON line per request.

The lines are a superset of the Mooncake trace format (``timestamp`` in milliseconds,
``input_length``, ``output_length``, ``hash_ids``), so any tool that replays Mooncake traces
replays these; loadlab's own replay (``[workload] kind = "trace"``) also reads the sessions,
turns and lengths the other keys add (docs/record.md lists them). The header names the unit
and block size of ``hash_ids`` and never holds the salt.

``TraceWriter`` takes lines from the proxy without ever blocking it: a bounded queue, emptied by
one task; a line that finds the queue full is dropped and counted, a write that fails (a full
disk) is counted and said once a minute, and the traffic goes on.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

import orjson

__all__ = ["FORMAT_VERSION", "TraceWriter"]

# 2: the prompt's blocks laid out as the model reads it less the template (``shape``), so the
# replay sizes a later turn by the recorded answer's share of the prompt; 1 had role markers
FORMAT_VERSION = 2
MAX_QUEUED = 100_000
BATCH = 64  # lines per write: a batch holds the event loop for its JSON (about 0.2 ms)


class TraceWriter:
    def __init__(self, path: Path, header: dict[str, Any], *, max_queued: int = MAX_QUEUED):
        self.path = path
        self.header = {"loadlab_trace": FORMAT_VERSION, **header}
        self.written = 0
        self.dropped = 0  # the queue was full
        self.failed = 0  # the write failed (OSError)
        self.last_error = ""
        self._queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(max_queued)
        self._file: IO[bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self._warned_at = 0.0

    async def start(self) -> None:
        self._file = open(self.path, "wb")
        self._write([self.header])
        self._task = asyncio.create_task(self._drain())

    def put(self, line: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(line)
        except asyncio.QueueFull:
            self.dropped += 1

    async def stop(self) -> None:
        if self._task is not None:
            await self._queue.put(None)
            await self._task
            self._task = None
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                self._fail(1, exc)
            self._file = None

    async def _drain(self) -> None:
        while True:
            line = await self._queue.get()
            batch = [line]
            while not self._queue.empty() and len(batch) < BATCH:
                batch.append(self._queue.get_nowait())
            stop = None in batch
            self._write([x for x in batch if x is not None])
            if stop:
                return
            await asyncio.sleep(0)  # the reads waiting meanwhile come before the next batch

    def _write(self, lines: list[dict[str, Any]]) -> None:
        if not lines or self._file is None:
            return
        data = b"".join(orjson.dumps(x) + b"\n" for x in lines)
        try:
            self._file.write(data)
            self._file.flush()
        except OSError as exc:
            self._fail(len(lines), exc)
            return
        self.written += len(lines) - (1 if lines[0] is self.header else 0)

    def _fail(self, n: int, exc: OSError) -> None:
        self.failed += n
        self.last_error = f"{type(exc).__name__}: {os.strerror(exc.errno) if exc.errno else exc}"
        now = time.monotonic()
        if now - self._warned_at >= 60:
            self._warned_at = now
            print(
                f"loadlab record: writing {self.path} failed ({self.last_error}); "
                f"{self.failed} trace line(s) lost so far; traffic still passes through",
                file=sys.stderr,
                flush=True,
            )
