"""A request made ready ahead of its send time, written the moment its gate fires.

An open-loop run starts each request a little before it is due (``loadlab._runner.runner``):
the client makes its record, frames the bytes and takes a connection (opening one if none is
idle) while there is time, then hands the gate the one thing left, the write. When the request
is due the scheduler fires the gate, and the write (stamp, ``transport.write``) runs inside that
call: no task switch, no connection set-up, nothing between the due time and the bytes.

A gate fires once; one withdrawn before it fired (the run stopped first) never writes, and its
request was never sent.

Example::

    gate = SendGate()
    task = asyncio.ensure_future(client.send(spec, t0_ns=t0, gate=gate))  # gets ready
    ...                                                                    # until due
    gate.fire()                                                            # written now
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["SendGate"]


class SendGate:
    """Holds a request's write until ``fire``; ``withdraw`` cancels it unwritten."""

    __slots__ = ("_waiter", "_write", "fired", "fired_ns", "withdrawn")

    def __init__(self) -> None:
        self.fired = False
        self.fired_ns = 0  # perf_counter_ns when it fired
        self.withdrawn = False
        self._write: Callable[[], None] | None = None
        self._waiter: asyncio.Future[bool] | None = None

    def fire(self) -> None:
        """Write now (the held write runs in this call); a later ``hold`` writes at once."""
        if self.fired or self.withdrawn:
            return
        self.fired = True
        self.fired_ns = time.perf_counter_ns()
        write, self._write = self._write, None
        if write is not None:
            write()
        self._wake(True)

    def withdraw(self) -> None:
        """The request will not be sent: a held write is dropped, ``hold`` returns False."""
        if self.fired or self.withdrawn:
            return
        self.withdrawn = True
        self._write = None
        self._wake(False)

    async def hold(self, write: Callable[[], None]) -> bool:
        """Run ``write`` when the gate fires (at once if it has) and return True; False, with
        ``write`` never run, when it is withdrawn first."""
        if self.fired:
            write()
            return True
        if self.withdrawn:
            return False
        self._write = write
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            return await self._waiter
        finally:
            self._write = None

    async def wait(self) -> bool:
        """Until the gate fires (True) or is withdrawn (False), with nothing to write."""
        return await self.hold(_nothing)

    def _wake(self, result: bool) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(result)


def _nothing() -> None:
    """The write of a request that its holder sends itself once the gate fired."""
