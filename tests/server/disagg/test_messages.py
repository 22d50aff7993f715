"""Every worker message crosses a process boundary intact: pickled through a real
``multiprocessing`` queue of the context the router uses, as between the router and workers."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import pickle
from typing import Any

import pytest

from reference_server.disagg import messages as m
from reference_server.sequence import SamplingParams, Sequence


def _seq() -> Sequence:
    params = SamplingParams(max_tokens=5, temperature=0.0, stop=("\n",))
    return Sequence("cmpl-1", [104, 105], params, 123, [7, 8])


SAMPLES: list[Any] = [
    m.Add(_seq()),
    m.Abort("cmpl-1"),
    m.Stop(),
    m.Offer(_seq(), 0),
    m.Up(1, {"num_kv_blocks": 40, "device": "cpu"}),
    m.Failed(1, "RuntimeError: no"),
    m.Crashed(1, "Traceback ..."),
    m.State(1, 12, 3),
    m.Step(1, "decode", 0.004, 0, 2, [("cmpl-1", 65, None), ("cmpl-2", 256, "stop")]),
    m.Ready(0, "cmpl-1", 2),
    m.Transfer(1, "cmpl-1", 1024, 0.002),
    m.Lost(1, "cmpl-1"),
    m.Pull("cmpl-1", 1, 7),
    m.Coming("cmpl-1", 7, 2),
    m.Gone("cmpl-1"),
]


def _fields(msg: Any) -> dict[str, Any]:
    """A message's fields, a ``Sequence`` (compared by identity) as its own fields."""
    out = {}
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        out[f.name] = vars(value) if isinstance(value, Sequence) else value
    return out


def test_every_message_kind_has_a_sample() -> None:
    kinds = {name for name in m.__all__ if isinstance(getattr(m, name), type)}
    assert {type(msg).__name__ for msg in SAMPLES} == kinds


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda msg: type(msg).__name__)
def test_message_survives_pickling(msg: Any) -> None:
    back = pickle.loads(pickle.dumps(msg))  # noqa: S301 (bytes this test just made)
    assert type(back) is type(msg) and _fields(back) == _fields(msg)


def test_messages_cross_a_multiprocessing_queue_in_order() -> None:
    q: Any = mp.get_context("forkserver").Queue()
    try:
        for msg in SAMPLES:
            q.put(msg)
        got = [q.get(timeout=10) for _ in SAMPLES]
    finally:
        q.close()
        q.join_thread()
    assert [type(g) for g in got] == [type(s) for s in SAMPLES]
    assert [_fields(g) for g in got] == [_fields(s) for s in SAMPLES]
