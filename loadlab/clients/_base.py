"""What every protocol adapter provides to the runners.

A client turns a ``RequestSpec`` into a ``Completion``: a ``RequestRecord`` with raw timestamps
(relative to the run's ``t0_ns``) and the generated text (the runner needs the text to build a
chat session's history; the text is never written to the results file). ``send`` never raises
for a transport or protocol failure: the failure is the record's outcome class.

Example::

    async with OpenAIClient("http://127.0.0.1:8000", model="m") as client:
        done = await client.send(spec, t0_ns=t0)
        print(done.record.outcome, loadlab._analysis.metrics.ttft_ms(done.record))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, Protocol, TypedDict, Unpack

from loadlab.clients._gate import SendGate
from loadlab.records import RequestRecord, RequestSpec

__all__ = ["Client", "Completion", "Message", "SendOptions"]

# {"role": "user" | "assistant" | "system" | "tool", "content": "..."}, in OpenAI chat's shape:
# an assistant turn that called tools has "tool_calls", a tool result has "tool_call_id"; each
# dialect's body builder turns these into its own (``loadlab.clients._tools``)
Message = Mapping[str, Any]


@dataclass
class Completion:
    """A request's record, its answer text and its tool calls (``{"id", "name",
    "arguments"}`` each, arguments as the JSON text the server streamed)."""

    record: RequestRecord
    text: str = ""
    tool_calls: tuple[Mapping[str, str], ...] = ()


class SendOptions(TypedDict):
    """The keyword arguments of ``Client.send``, named once so that a client that wraps
    others (a router, a test double) can take and pass them on as ``**options``."""

    t0_ns: int  # the run's start, perf_counter_ns: the record's stamps are relative to it
    history: NotRequired[Sequence[Message]]  # the chat session so far (chat API only); ()
    intended_ns: NotRequired[int | None]  # when the schedule meant it to go; None: closed loop
    # the request body, encoded ahead of the send time by the client's own ``encode_body``
    # (an open-loop run does it while it waits); absent: the client encodes it when sending
    body: NotRequired[bytes]
    # the request is made ready now and written when the gate fires (``loadlab.clients._gate``;
    # a client that takes it says so with ``SENDS_AT_GATE = True``)
    gate: NotRequired[SendGate]


class Client(Protocol):
    async def __aenter__(self) -> Client: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def send(self, spec: RequestSpec, **options: Unpack[SendOptions]) -> Completion:
        """Send one request (keyword options: ``SendOptions``)."""
        ...
