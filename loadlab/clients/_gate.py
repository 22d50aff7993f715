"""A request made ready ahead of its send time, written the moment its gate fires.

An open-loop run starts each request a little before it is due (``loadlab._runner.runner``):
the client makes its record, frames the bytes and takes a connection (opening one if none is
idle) while there is time, then hands the gate the one thing left, the write. When the request
is due the gate fires, and the write (stamp, send) runs inside that call: no task switch, no
connection set-up, nothing between the due time and the bytes.

Two ways to fire: ``fire`` on the event loop's thread runs the held ``write``;
``fire_threadsafe``, from the run's sender thread (``loadlab._runner.sender``), runs the held
``direct`` write in that thread, so that a request goes out on time while the loop is busy
reading other streams, and hands the loop what is left (``direct`` returns it: the bytes the
socket did not take, a timer). A gate held without a ``direct`` write (a transport that sends
through its own client) has its ``write`` run on the loop, as soon as the loop gets to it.

A gate fires once; one withdrawn before it fired (the run stopped first) never writes, and its
request was never sent. ``withdraw`` and ``hold`` are called on the loop's thread.

Example::

    gate = SendGate()
    task = asyncio.ensure_future(client.send(spec, t0_ns=t0, gate=gate))  # gets ready
    ...                                                                    # until due
    gate.fire()                                                            # written now
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

__all__ = ["SendGate"]


_LOCK = threading.Lock()  # a gate's state, between the loop's thread and the sender's

Direct = Callable[[], Callable[[], None] | None]


class SendGate:
    """Holds a request's write until ``fire``; ``withdraw`` cancels it unwritten."""

    __slots__ = ("_direct", "_loop", "_waiter", "_write", "by_thread", "fired", "fired_ns",
                 "withdrawn")  # fmt: skip

    def __init__(self) -> None:
        self.fired = False
        self.fired_ns = 0  # perf_counter_ns when it fired
        self.withdrawn = False
        self.by_thread = False  # the held ``direct`` write ran in the sender's thread
        self._write: Callable[[], None] | None = None
        self._direct: Direct | None = None
        self._waiter: asyncio.Future[bool] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def fire(self) -> None:
        """Write now (the held write runs in this call); a later ``hold`` writes at once."""
        with _LOCK:
            if self.fired or self.withdrawn:
                return
            self.fired = True
            self.fired_ns = time.perf_counter_ns()
            write, self._write, self._direct = self._write, None, None
        if write is not None:
            write()
        self._wake(True)

    def fire_threadsafe(self) -> None:
        """``fire`` from a thread that is not the loop's: the held ``direct`` write runs in this
        call and the loop runs what it returns; without one, the loop runs ``write``. Not held
        yet: ``hold`` writes at once when it comes."""
        with _LOCK:
            if self.fired or self.withdrawn:
                return
            self.fired = True
            self.fired_ns = time.perf_counter_ns()
            loop = self._loop
            if loop is None:  # not held yet
                return
            write, direct = self._write, self._direct
            self._write = self._direct = None
            self.by_thread = direct is not None
        after = write
        if direct is not None:
            try:
                after = direct()
            except Exception:  # nothing written yet: the loop writes it (and says why it fails)
                after = write
        loop.call_soon_threadsafe(self._written, after)

    def _written(self, after: Callable[[], None] | None) -> None:
        if after is not None:
            after()
        self._wake(True)

    def withdraw(self) -> None:
        """The request will not be sent: a held write is dropped, ``hold`` returns False."""
        with _LOCK:
            if self.fired or self.withdrawn:
                return
            self.withdrawn = True
            self._write = self._direct = None
        self._wake(False)

    async def hold(self, write: Callable[[], None], direct: Direct | None = None) -> bool:
        """Run ``write`` when the gate fires (at once if it has) and return True; False, with
        ``write`` never run, when it is withdrawn first. ``direct``: the same write for the
        sender's thread, which returns what the loop is to run after it (or None)."""
        with _LOCK:
            fired, withdrawn = self.fired, self.withdrawn
            if not fired and not withdrawn:
                self._write, self._direct = write, direct
                self._loop = asyncio.get_running_loop()
                self._waiter = self._loop.create_future()
        if fired:
            write()
            return True
        if withdrawn:
            return False
        assert self._waiter is not None  # noqa: S101 - set above
        try:
            return await self._waiter
        finally:
            self._write = self._direct = None

    async def wait(self) -> bool:
        """Until the gate fires (True) or is withdrawn (False), with nothing to write."""
        return await self.hold(_nothing)

    def _wake(self, result: bool) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(result)


def _nothing() -> None:
    """The write of a request that its holder sends itself once the gate fired."""
