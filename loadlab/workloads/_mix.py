"""Mixed traffic: several workloads (chat, agent, batch, synthetic, trace) in one run, each its
own request class, so one run's report and SLO verdict hold every class to its own objectives
(``[classes.<name>]`` in the SLO file).

``[workload]`` keys (kind = "mix")::

    [[workload.mix]]    one table per class: a workload of any other kind (its own keys),
                        plus ``share``, its part of the run (default: equal parts)
    exact_output, reasoning_effort
                        for every part that does not set its own (``--exact-output``)

Each part is built as its own run with the run's settings scaled by its share: in open loop
``rate_rps`` x share (its sessions' or requests' arrivals), ``requests`` x share (rounded up),
and its own seed (the run's seed and its position; ``reasoning_effort`` and the sizing of
prompts apply to each part as to a run of its own), then the parts are merged: in open loop
by intended send time, in closed loop interleaved in proportion to the shares (a smooth
weighted round robin). A chat or agent session stays whole. Request and session ids get the
part's class as a prefix, so they stay unique. A part's ``request_class`` defaults to its
kind's (``chat``, ``agent``, ``batch``, ``synthetic``, ``trace``).

Example::

    workload = {"kind": "mix", "mix": [
        {"kind": "chat", "share": 0.6, "turns": 3},
        {"kind": "agent", "share": 0.3, "tool_rounds": 3},
        {"kind": "batch", "share": 0.1, "documents": 20},
    ]}
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.workloads._base import RequestStream, with_reasoning_effort
from loadlab.workloads._exact import Sizing
from loadlab.workloads._params import WorkloadError, check_keys

__all__ = ["mix_requests", "validate"]

Kinds = Mapping[str, tuple[Callable[..., Any], Callable[..., RequestStream]]]
_DEFAULT_CLASS = {"synthetic": "synthetic", "chat": "chat", "agent": "agent", "batch": "batch",
                  "trace": "trace"}  # fmt: skip
# keys of the mix itself that every part takes unless it sets its own
_FOR_EVERY_PART = ("exact_output", "reasoning_effort")


def _parts(params: Mapping[str, Any], kinds: Kinds) -> list[tuple[dict[str, Any], float]]:
    """Each part's workload (``share`` removed, its class set) and its share (sum 1)."""
    parts = params.get("mix")
    if not isinstance(parts, list) or not parts or not all(isinstance(p, Mapping) for p in parts):
        raise WorkloadError("workload.mix: a list of workload tables, e.g. [[workload.mix]]")
    # cache_bust and salt salt the merged stream (build_requests), not each part again
    check_keys("mix", params, {"kind", "mix", "cache_bust", "salt", *_FOR_EVERY_PART})
    out, classes = [], set()
    for i, p in enumerate(parts):
        sub = {**{k: params[k] for k in _FOR_EVERY_PART if k in params}, **p}
        kind = str(sub.get("kind", "synthetic"))
        if kind not in kinds or kind == "mix":
            raise WorkloadError(
                f"workload.mix[{i}].kind = {kind!r}: one of {sorted(_DEFAULT_CLASS)}"
            )
        share = sub.pop("share", 1.0 / len(parts))
        if isinstance(share, bool) or not isinstance(share, int | float) or not share > 0:
            raise WorkloadError(f"workload.mix[{i}].share = {share!r}: a number > 0")
        sub.setdefault("request_class", _DEFAULT_CLASS[kind])
        if sub["request_class"] in classes:
            raise WorkloadError(
                f"workload.mix[{i}]: class {sub['request_class']!r} twice; give each part its "
                "own request_class"
            )
        classes.add(sub["request_class"])
        out.append((sub, float(share)))
    total = sum(s for _, s in out)
    return [(sub, s / total) for sub, s in out]


def _part_config(cfg: RunConfig, sub: Mapping[str, Any], share: float, i: int) -> RunConfig:
    return dataclasses.replace(
        cfg,
        workload=sub,
        rate_rps=cfg.rate_rps * share if cfg.rate_rps is not None else None,
        requests=math.ceil(cfg.requests * share) if cfg.requests is not None else None,
        seed=(cfg.request_seed * 1009 + i + 1) % 2**63,
    )


def validate(
    cfg: RunConfig, params: Mapping[str, Any], bases: Sequence[Path] = (), *, kinds: Kinds
) -> None:
    for i, (sub, share) in enumerate(_parts(params, kinds)):
        kinds[str(sub.get("kind", "synthetic"))][0](_part_config(cfg, sub, share, i), sub, bases)


def _units(specs: Iterator[RequestSpec], tag: str) -> Iterator[list[RequestSpec]]:
    """A part's specs as units (one request, or one whole session), ids prefixed by ``tag``."""
    unit: list[RequestSpec] = []
    for spec in specs:
        spec = dataclasses.replace(
            spec,
            request_id=f"{tag}-{spec.request_id}",
            session_id=None if spec.session_id is None else f"{tag}-{spec.session_id}",
        )
        if unit and not (spec.session_id is not None and spec.session_id == unit[0].session_id):
            yield unit
            unit = []
        unit.append(spec)
    if unit:
        yield unit


def _by_time(streams: list[Iterator[list[RequestSpec]]]) -> Iterator[list[RequestSpec]]:
    """Open loop: units in order of their first request's intended time."""
    iters = [
        (((u[0].intended_at_s or 0.0), i, n, u) for n, u in enumerate(s))
        for i, s in enumerate(streams)
    ]
    for *_, unit in heapq.merge(*iters, key=lambda t: t[:3]):
        yield unit


def _weighted(
    streams: list[Iterator[list[RequestSpec]]], shares: list[float]
) -> Iterator[list[RequestSpec]]:
    """Closed loop: a smooth weighted round robin over the parts (nginx's: each turn every
    part gains its share, the richest is served and pays 1), skipping parts that ran out."""
    credit = [0.0] * len(streams)
    alive = [True] * len(streams)
    while any(alive):
        for i, s in enumerate(shares):
            credit[i] += s if alive[i] else 0.0
        i = max((j for j in range(len(streams)) if alive[j]), key=lambda j: credit[j])
        credit[i] -= 1.0
        unit = next(streams[i], None)
        if unit is None:
            alive[i] = False
            continue
        yield unit


def mix_requests(cfg: RunConfig, sizing: Sizing | None = None, *, kinds: Kinds) -> RequestStream:
    parts = _parts(cfg.workload, kinds)
    streams: list[RequestStream] = []
    for i, (sub, share) in enumerate(parts):
        part_cfg = _part_config(cfg, sub, share, i)
        kind = str(sub.get("kind", "synthetic"))
        streams.append(with_reasoning_effort(kinds[kind][1](part_cfg, sizing), sub))
    units = [
        _units(s, str(sub["request_class"])) for s, (sub, _) in zip(streams, parts, strict=True)
    ]
    merged = (
        _by_time(units) if cfg.rate_rps is not None else _weighted(units, [s for _, s in parts])
    )
    specs: Iterator[RequestSpec] = itertools.chain.from_iterable(merged)
    if cfg.requests is not None:
        specs = itertools.islice(specs, cfg.requests)

    def extra() -> dict[str, Any]:
        return {"kind": "mix", "parts": [s.extra() for s in streams]}

    return RequestStream(specs, extra)
