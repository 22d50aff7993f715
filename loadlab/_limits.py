"""What one machine can carry: the ranges ``RunConfig`` checks every numeric setting against.

A run that asks for more than the machine has fails before it starts, with the fix in the
message, instead of growing memory without bound or running out of sockets mid-run.
Two limits come from the machine, read once per process:

* **streams per process**: the soft open-file limit (``ulimit -n``) less ``FD_RESERVE`` for
  the interpreter, the journal and the results file. Every request in flight holds one socket,
  so ``--concurrency`` and ``--max-in-flight`` may not pass it times ``--workers``; nor may
  ``--rate``, because a request that lasts one second holds its socket for that second.
* **memory**: ``MemAvailable`` from ``/proc/meminfo`` (else the physical memory). Every request
  of a run is kept as a record until the results file is written, ``RECORD_BYTES`` at least
  (its timestamps, prompt and text grow it), and every stream in flight holds
  ``STREAM_BYTES`` of buffers and parse state; the run's planned requests and streams must
  fit.

The fixed ranges (``MAX_*``) are far past any real run and exist so that ``inf``, ``1e308`` or a
20-digit integer is refused rather than overflowing a C integer or a timer.

>>> limits = machine_limits()
>>> limits.streams_per_process > 0 and limits.memory_bytes > 0
True
"""

from __future__ import annotations

import functools
import os
import resource
from dataclasses import dataclass

__all__ = [
    "FD_RESERVE",
    "MAX_DURATION_S",
    "MAX_REQUESTS",
    "MAX_TOKENS",
    "MAX_WORKERS",
    "RECORD_BYTES",
    "STREAM_BYTES",
    "MachineLimits",
    "machine_limits",
]

FD_RESERVE = 64  # descriptors kept for the interpreter, the journal, the results file, pipes
RECORD_BYTES = 4096  # the least one finished request costs in memory until the file is written
STREAM_BYTES = 256 * 1024  # socket buffers, the read buffer and parse state of one open stream
MAX_DURATION_S = 30 * 86_400.0  # 30 days: any time setting (duration, timeouts, warm-up)
MAX_REQUESTS = 100_000_000  # requests of one run (memory usually says less: RECORD_BYTES each)
MAX_TOKENS = 10_000_000  # prompt or output tokens of one request, past any context window
MAX_WORKERS = 1024  # worker processes of one run


@dataclass(frozen=True)
class MachineLimits:
    """This machine's limits as one process sees them."""

    streams_per_process: int  # open sockets one process can hold (open files less a reserve)
    memory_bytes: int  # memory available to the run

    def streams(self, workers: int) -> int:
        """Streams ``workers`` processes can hold at once (sockets and memory together)."""
        by_memory = self.memory_bytes // STREAM_BYTES
        return max(1, min(self.streams_per_process * workers, by_memory))

    def requests(self) -> int:
        """Records that fit in memory."""
        return max(1, min(MAX_REQUESTS, self.memory_bytes // RECORD_BYTES))


@functools.cache
def machine_limits() -> MachineLimits:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return MachineLimits(
        streams_per_process=max(1, int(soft) - FD_RESERVE), memory_bytes=_memory_bytes()
    )


def _memory_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (OSError, ValueError):  # pragma: no cover - every POSIX system has these
        return 1 << 34
