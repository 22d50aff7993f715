"""Connections whose request does not arrive in time are closed.

uvicorn closes a keep-alive connection left idle after a response (``timeout_keep_alive``),
but it waits without end for the first request of a new connection, for the rest of a header
and for the rest of a body: a client that opens sockets and sends nothing (or a byte a minute)
holds them as long as it likes. ``with_request_deadline(s)`` is uvicorn's h11 protocol with one
timer more, armed when a connection opens and again when each response ends: when it fires and
the next request (its headers and its whole body) has not arrived, the connection is closed,
and the app sees a disconnect, as for a client that went away. A request that has arrived is
never cut, however long its answer streams.

    uvicorn.Config(app, http=with_request_deadline(30.0))
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["with_request_deadline"]


class _DeadlineH11Protocol(H11Protocol):
    request_deadline_s = 30.0
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.request_deadline_s, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        waiting = self.conn.their_state in (h11.IDLE, h11.SEND_BODY)  # no request, or half
        if waiting and not self.transport.is_closing():
            self.transport.close()


def with_request_deadline(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request has not fully arrived
    ``seconds`` after it opened or after its previous response ended."""
    if not seconds > 0:
        raise ValueError(f"the request deadline must be > 0 s, got {seconds}")
    return type("DeadlineH11Protocol", (_DeadlineH11Protocol,), {"request_deadline_s": seconds})
