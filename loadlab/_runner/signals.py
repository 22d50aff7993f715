"""Stop signals: SIGINT, SIGTERM and SIGHUP all end a run the same way.

What each does (docs/failure-and-recovery.md):

* before the run has started (flags checked, the embedded server starting), the first stop
  signal stops the command at once: nothing was sent, there is nothing to write;
* during the run, the runner stops sending, cancels the requests in flight (recorded
  ``cancelled``) and returns; the results file is written and the summary printed;
* after the run, while the file is written, every further signal is noted and ignored, so a
  second Ctrl-C (or a SIGTERM after a SIGINT) can no longer leave a half-written file;
* the exit code is 128 + the first signal's number: 130 for SIGINT, 143 for SIGTERM, 129 for
  SIGHUP, as a shell reports a process that signal ended.

``install()`` puts this module's handler in place for one command; ``run_endpoint`` replaces it
while its runs last with one that notes the signal and stops every run of the process
(``Runner.stop``; ``loadlab._runner.endpoint._StopSignals``), and calls ``begin_run()`` so that
from then on a signal is only noted. The state is per process: a
``--workers`` child has its own copy and is stopped by its parent (``loadlab._runner.fanout``).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

__all__ = [
    "STOP_SIGNALS",
    "begin_run",
    "exit_code",
    "first_received",
    "install",
    "note",
    "owns_process",
    "stop_parent_death",
    "stop_requested",
]

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_received: list[int] = []
_run_begun = False
_installed = False
_owns_process = False
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def note(signum: int) -> None:
    """Remember a stop signal (the first one decides the exit code)."""
    _received.append(int(signum))


def first_received() -> int | None:
    return _received[0] if _received else None


def stop_requested() -> bool:
    """A stop signal came during the command now running (inside ``install``). A signal noted
    by a command that has ended (its exit code still reads it) does not stop the next run in
    the same process, e.g. a test's or a script's."""
    return _installed and bool(_received)


def exit_code(default: int = 130) -> int:
    """128 + the first stop signal's number; ``default`` when none came (a stop by code)."""
    first = first_received()
    return default if first is None else 128 + first


def begin_run() -> None:
    """From now on a stop signal is noted, never raised: what was sent must be written."""
    global _run_begun
    _run_begun = True


def _handler(signum: int, frame: FrameType | None) -> None:
    note(signum)
    if not _run_begun:
        raise KeyboardInterrupt  # nothing sent yet: stop where we are (cli.main: 128 + signum)


@contextlib.contextmanager
def install() -> Iterator[None]:
    """This module's handler for every stop signal, for the length of one command."""
    global _run_begun, _installed
    _received.clear()
    _run_begun = False
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    _installed = True
    try:
        for s in STOP_SIGNALS:
            signal.signal(s, _handler)
        yield
    finally:
        _installed = False
        for s, handler in previous.items():
            if _run_begun and _owns_process:
                # the results are written; the process only has to exit now, and a signal
                # during the interpreter's shutdown (which puts the default handlers back)
                # would kill it with that signal instead of its exit code: ignore them now
                signal.signal(s, signal.SIG_IGN)
            elif handler is not None:
                signal.signal(s, handler)


def owns_process() -> None:
    """The command runs as its own process (``loadlab ...``, not ``cli.main([...])`` inside
    another program): once its run has begun, ``install`` ignores stop signals at its end."""
    global _owns_process
    _owns_process = True


def stop_parent_death() -> None:
    """Ask Linux to send this (child) process SIGTERM when its parent dies, even by kill -9,
    so a ``--workers`` child never keeps sending as an orphan. Elsewhere a no-op."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
