"""The open loop's sender: a thread that fires each request's gate at its due time.

The event loop does everything else a run does: it builds prompts ahead, starts each request
``SEND_LEAD_NS`` before it is due (record, framing, connection), reads every stream and stamps
its tokens. When many streams' tokens arrive together, one turn of the loop runs hundreds of
callbacks, and a request due in that turn waited for all of them: a busy trace replay's sends
came in groups, 5-15 ms late. From a thread of its own, each send waits only for the
interpreter's lock, which the loop gives up within the run's switch interval (0.2 ms,
``loadlab._runner.runner.SWITCH_INTERVAL_S``): the gate's direct write (``loadlab.clients.
_gate``) stamps the request and writes it on the socket in this thread, and the loop finishes
what is left when it gets to it (the bytes a full socket did not take, the read timer).

Example::

    sender = Sender(lags, stats)  # lags: each request's dispatch lag, appended here
    sender.start()
    sender.add(due_ns, gate)
    ...
    for gate in sender.stop():  # not yet due: never sent
        gate.withdraw()
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import os
import platform
import threading
import time
from typing import Protocol

from loadlab.clients._gate import SendGate

__all__ = ["Counts", "Sender"]


class Counts(Protocol):
    """Where the sender counts the gates it fired (the runner's ``LiveStats``)."""

    fired: int


class Sender(threading.Thread):
    """Fires the gates it is given, each at its due time (``perf_counter_ns``), in due order."""

    def __init__(self, lags_ns: list[int], stats: Counts | None = None) -> None:
        super().__init__(name="loadlab-sender", daemon=True)
        self.lags_ns = lags_ns  # each fired gate's lag behind its due time (list appends: atomic)
        self.stats = stats  # its ``fired`` counts the gates fired (this thread alone writes it)
        self._cond = threading.Condition(threading.Lock())
        self._due: list[tuple[int, int, SendGate]] = []  # a heap: (due_ns, order, gate)
        self._order = itertools.count()
        self._stopped = False
        self.priority = "default"  # what the thread got of the kernel's scheduler (priority)

    def add(self, due_ns: int, gate: SendGate) -> None:
        with self._cond:
            heapq.heappush(self._due, (due_ns, next(self._order), gate))
            if self._due[0][2] is gate:  # the earliest now: the thread's wait changes
                self._cond.notify()

    def stop(self) -> list[SendGate]:
        """Fire nothing more; the gates not fired yet, for the caller to withdraw (on the
        loop's thread). A gate being fired as this is called is fired."""
        with self._cond:
            self._stopped = True
            left = [gate for _, _, gate in sorted(self._due)]
            self._due.clear()
            self._cond.notify()
        return left

    def next_due_ns(self) -> int | None:
        """When the next gate is due (perf_counter_ns); None when none is waiting."""
        with self._cond:
            return self._due[0][0] if self._due else None

    def run(self) -> None:
        self.priority = priority()
        clock, cond, due = time.perf_counter_ns, self._cond, self._due
        while True:
            with cond:
                while not self._stopped and not due:
                    cond.wait()
                if self._stopped:
                    return
                wait_ns = due[0][0] - clock()
                if wait_ns > 0:
                    cond.wait(wait_ns / 1e9)  # (or an earlier one came, or stop)
                    continue
                due_ns, _, gate = heapq.heappop(due)
            self.lags_ns.append(clock() - due_ns)
            gate.fire_threadsafe()
            if self.stats is not None:
                self.stats.fired += 1


SLICE_NS = 100_000  # the sender thread's slice: the shortest Linux grants (0.1 ms)
_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}  # the system call's number
_SCHED_ATTR_SIZE = 56  # struct sched_attr, its first version with utilisation clamps


class _SchedAttr(ctypes.Structure):
    _fields_ = [  # ctypes reads it from the class
        ("size", ctypes.c_uint32),
        ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32),
        ("sched_runtime", ctypes.c_uint64),
        ("sched_deadline", ctypes.c_uint64),
        ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32),
        ("sched_util_max", ctypes.c_uint32),
    ]


def priority() -> str:
    """Ask the kernel to run the calling thread as soon as it wakes: ``"realtime"`` (the lowest
    ``SCHED_FIFO`` priority, where the process may: root, or ``CAP_SYS_NICE``), else
    ``"short slice"`` (Linux 6.12 and later, any user: a thread that wakes with a shorter slice
    than the running one's takes the CPU at once, where with the default 3 ms it may wait for
    the running thread's slice, the event loop's on the same CPU, to end), else ``"default"``.

    A real-time thread that never slept could starve its CPU; this one sleeps until each due
    time and writes (tens of microseconds a request), and Linux keeps 5 % of every second for
    other threads whatever runs in real time."""
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(1))
        return "realtime"
    except (OSError, AttributeError):
        pass
    number = _SCHED_SETATTR.get(platform.machine())
    if number is None:
        return "default"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        attr = _SchedAttr(size=_SCHED_ATTR_SIZE, sched_policy=os.SCHED_OTHER,
                          sched_nice=os.getpriority(os.PRIO_PROCESS, tid),  # (kept as it is)
                          sched_runtime=SLICE_NS)  # fmt: skip
        if libc.syscall(number, tid, ctypes.byref(attr), 0) == 0:
            return "short slice"
    except (OSError, AttributeError):
        pass
    return "default"
