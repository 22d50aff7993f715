"""Workloads: what traffic a run sends. ``build_requests(cfg)`` is the one entry point.

``cfg.workload["kind"]`` picks the generator::

    synthetic   independent requests, fixed or drawn lengths     (loadlab.workloads._synthetic)
    chat        multi-turn sessions with think times             (loadlab.workloads._chat)
    batch       a job of N documents at once or under a cap      (loadlab.workloads._batch)
    trace       Azure / Mooncake / BurstGPT replay               (loadlab.workloads._replay)
    agent       tool-calling sessions (tool results after a think time)  (loadlab.workloads._agent)
    mix         several of these in one run, one request class each      (loadlab.workloads._mix)
    prefix      shared system prompt or prefix pools, cache-busting (loadlab.workloads._prefix)
    dataset     real text: ShareGPT, JSONL, local HF datasets    (loadlab.workloads._dataset)

Every kind also takes ``reasoning_effort`` ("low", "medium", "high"): passed to the API
(chat ``reasoning_effort``, Responses ``reasoning.effort``) on every request.
``cache_bust = true`` (``--cache-bust``) on any kind starts the run cold: a salt unique to the
run goes after every prompt's first word (``salted``), so no prompt matches what the server
cached before, while the lengths, the requests and the sharing within the run stay as they
were (``salt = "..."`` fixes it; a ``prefix`` workload places its own).

Open loop (``cfg.rate_rps`` set): specs come in order of ``intended_at_s`` (a chat session's
later turns follow its first, with ``intended_at_s = None``). Closed loop: all ``None``.

After the run, ``workload_extra(specs)`` gives what the workload did (a trace's skipped lines,
failed rows, thinning...) for ``results.extra["workload"]``.

Example::

    from loadlab.config import RunConfig
    from loadlab.workloads import build_requests, workload_extra

    cfg = RunConfig(rate_rps=4, requests=100, workload={"kind": "chat", "sessions": 20})
    specs = build_requests(cfg, sizing)   # sizing: None, or one endpoint's (exact prompts)
    for spec in specs: ...
    results.extra["workload"] = workload_extra(specs)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.workloads import (
    _agent as agent,
)
from loadlab.workloads import (
    _batch as batch,
)
from loadlab.workloads import (
    _chat as chat,
)
from loadlab.workloads import (
    _dataset as dataset,
)
from loadlab.workloads import (
    _mix as mix,
)
from loadlab.workloads import (
    _pooling as pooling,
)
from loadlab.workloads import (
    _prefix as prefix,
)
from loadlab.workloads import (
    _replay as replay,
)
from loadlab.workloads import (
    _synthetic as synthetic,
)
from loadlab.workloads._base import PREFETCH_SPECS, RequestStream, run_salt, with_reasoning_effort
from loadlab.workloads._exact import Sizing, exact_prompts
from loadlab.workloads._lengths import DATASETS
from loadlab.workloads._params import TRACES, WorkloadError, closest, resolve_path
from loadlab.workloads._prompts import salted
from loadlab.workloads._tokenizers import check_tokenizer

__all__ = [
    "KINDS",
    "RequestStream",
    "WorkloadError",
    "build_requests",
    "rate_unit",
    "resolve_workload_paths",
    "validate_workload",
    "workload_extra",
]

KINDS: dict[str, tuple[Callable[..., Any], Callable[..., RequestStream]]] = {
    "synthetic": (synthetic.validate, synthetic.synthetic_requests),
    "chat": (chat.validate, chat.chat_requests),
    "batch": (batch.validate, batch.batch_requests),
    "trace": (replay.validate, replay.trace_requests),
    "agent": (agent.validate, agent.agent_requests),
    "prefix": (prefix.validate, prefix.prefix_requests),
    "dataset": (dataset.validate, dataset.dataset_requests),
    "embeddings": (pooling.validate, pooling.embedding_requests),
    "rerank": (pooling.validate, pooling.rerank_requests),
}
KINDS["mix"] = (
    functools.partial(mix.validate, kinds=KINDS),
    functools.partial(mix.mix_requests, kinds=KINDS),
)


def _kind(workload: Mapping[str, Any]) -> str:
    kind = workload.get("kind", "synthetic")
    if kind not in KINDS:
        hint = closest(str(kind), KINDS)
        fix = f"did you mean {hint!r}?" if hint else f"choose one of {', '.join(KINDS)}"
        raise WorkloadError(f"workload.kind = {kind!r}: unknown workload kind; {fix}")
    return str(kind)


def validate_workload(cfg: RunConfig, bases: Sequence[Path] = ()) -> None:
    """Raise ``WorkloadError`` for the first bad ``[workload]`` key or value (files included),
    or a ``tokenizer`` that cannot be loaded."""
    kind = _kind(cfg.workload)
    KINDS[kind][0](cfg, cfg.workload, bases)
    check_tokenizer(cfg.tokenizer, bases)


def rate_unit(workload: Mapping[str, Any]) -> str:
    """What ``--rate`` counts for this workload: chat *sessions* start at the rate (each then
    sends several requests, so more requests/s go out than the rate says); every other kind
    sends requests at it.

    >>> rate_unit({"kind": "chat"}), rate_unit({"kind": "synthetic"})
    ('sessions/s', 'requests/s')
    """
    return "sessions/s" if _kind(workload) == "chat" else "requests/s"


def build_requests(
    cfg: RunConfig, sizing: Sizing | None = None, *, read_ahead: int = PREFETCH_SPECS
) -> Iterator[RequestSpec]:
    """The run's requests, lazily (endless for a closed-loop run stopped by duration), the
    first ``read_ahead`` built now (``RequestStream.read_ahead``; 0 builds each when asked).

    ``sizing`` makes every prompt exactly its requested length as one endpoint counts it
    (``loadlab.workloads._exact``; the run makes it from ``cfg.tokenizer``, once per endpoint:
    ``loadlab._runner.prompt_sizing``). Without one, prompts are drafts at the workload's
    ``chars_per_token`` (1.0, the reference server's byte tokenizer, when it has none).

    A config without a seed (``seed = None``: a run draws one first, ``RunConfig.seeded``)
    builds the requests of seed 0 (``RunConfig.request_seed``), so a build outside a run
    repeats."""
    kind = _kind(cfg.workload)
    stream: RequestStream = KINDS[kind][1](cfg, sizing)
    if kind != "mix":  # a mix gives each part its own
        stream = with_reasoning_effort(stream, cfg.workload)
    salt = run_salt(cfg.workload) if kind != "prefix" else ""  # a prefix workload salts its own
    if salt:
        stream = _salted(stream, salt)
    if not prefix.fits_itself(cfg, sizing):  # a prefix workload with a tokenizer fits its own
        stream = exact_prompts(stream, sizing)  # outermost: its read-ahead is counted exactly
    return stream.read_ahead(read_ahead) if read_ahead > 0 else stream


def _salted(stream: RequestStream, salt: str) -> RequestStream:
    """Every prompt with the run's salt (``cache_bust``, ``salt``): unseen by the server's
    prefix cache, the same lengths and shape (``loadlab.workloads._prompts.salted``)."""
    specs = (dataclasses.replace(s, prompt=salted(s.prompt, salt)) for s in stream)
    return RequestStream(specs, lambda: {**stream.extra(), "cache_bust": True, "salt": salt})


def workload_extra(specs: Iterator[RequestSpec]) -> dict[str, Any]:
    """What the workload did, as plain data for ``results.extra["workload"]`` (empty for an
    iterator that did not come from ``build_requests``). Call it after the run."""
    return specs.extra() if isinstance(specs, RequestStream) else {}


_PATH_KEYS = ("path", "arrival_trace")


def resolve_workload_paths(workload: Mapping[str, Any], bases: Sequence[Path]) -> dict[str, Any]:
    """A copy of ``workload`` whose file paths are absolute (found against ``bases``, the
    working directory, then the repository root), so a run does not depend on its cwd."""
    out = dict(workload)
    for key in _PATH_KEYS:
        if isinstance(out.get(key), str) and out[key] not in TRACES:  # a name stays a name
            out[key] = str(resolve_path(out[key], f"workload.{key}", bases))
    for key, value in list(out.items()):
        if isinstance(value, Mapping) and isinstance(value.get("file"), str):
            if value["file"] not in DATASETS:
                table = dict(value)
                table["file"] = str(resolve_path(value["file"], f"workload.{key}.file", bases))
                out[key] = table
    return out
