"""The trace file ``loadlab record`` writes: a header line, then one JSON line per request.

The lines are a superset of the Mooncake trace format (``timestamp`` in milliseconds,
``input_length``, ``output_length``, ``hash_ids``), so any tool that replays Mooncake traces
replays these; loadlab's own replay (``[workload] kind = "trace"``) also reads the sessions,
turns and lengths the other keys add (docs/record.md lists them). The header names the unit
and block size of ``hash_ids`` and never holds the salt.

``TraceWriter`` writes them in the trace writer's process (``loadlab._record.tracer``), a
batch at a time; a write that fails (a full disk) is counted and said once a minute, and the
traffic goes on.
"""

from __future__ import annotations

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


class TraceWriter:
    def __init__(self, path: Path, header: dict[str, Any]):
        self.path = path
        self.header = {"loadlab_trace": FORMAT_VERSION, **header}
        self.written = 0
        self.failed = 0  # the write failed (OSError)
        self.last_error = ""
        self._file: IO[bytes] | None = None
        self._warned_at = 0.0

    def open(self) -> None:
        self._file = open(self.path, "wb")
        self.write([self.header])

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                self._fail(1, exc)
            self._file = None

    def write(self, lines: list[dict[str, Any]]) -> None:
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
