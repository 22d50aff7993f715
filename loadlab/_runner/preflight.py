"""Before a run: what each endpoint's server says about itself, used where it settles things.

- **The model.** Without ``--model`` (the name left at ``EndpointConfig``'s default), the
  server's own model from ``GET /v1/models`` is sent: its only one, else its first (said in a
  note); a server that lists the default name, or lists nothing, keeps it.
- **The context.** A request whose prompt and answer cannot fit the server's context
  (``max_model_len``: ``/v1/server_info``, or vLLM's model card) would only come back as a
  400: the run is refused before it starts (``ConfigError``, exit 2) with the numbers and the
  fix. The first ``SCAN`` requests of the workload are checked, their requested lengths, no
  prompt text sized; a session's later turn counts its history as the chat workload does
  (``loadlab.workloads._chat.turn_context``).

Example::

    cfg, infos, notes = preflight(cfg)     # raises ConfigError for a request that cannot fit
    results.extra["server_info"] = infos[endpoint.name].to_dict()
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable

from loadlab.clients._server_info import ServerInfo, server_info
from loadlab.config import EndpointConfig, RunConfig
from loadlab.errors import ConfigError
from loadlab.records import RequestSpec
from loadlab.workloads._chat import turn_context

__all__ = ["DEFAULT_MODEL", "SCAN", "check_context", "preflight", "served_model"]

DEFAULT_MODEL = str(EndpointConfig.__dataclass_fields__["model"].default)
SCAN = 2048  # requests checked against the context (as many as a run builds before it starts)
_SESSION_KINDS = ("chat", "agent", "dataset")


def served_model(ep: EndpointConfig, info: ServerInfo) -> tuple[EndpointConfig, str | None]:
    """``ep`` with the server's model when none was chosen (module docstring); and a note."""
    if ep.model != DEFAULT_MODEL or not info.models or ep.model in info.models:
        return ep, None
    model = info.models[0]
    note = f"endpoint {ep.name}: no --model given; sending the server's model {model!r}"
    if len(info.models) > 1:
        note += f" (the first of {len(info.models)} it lists: choose one with --model)"
    return dataclasses.replace(ep, model=model), note + " (GET /v1/models)"


def _needs(specs: Iterable[RequestSpec]) -> Iterable[tuple[RequestSpec, int]]:
    """Each spec with the tokens it holds at the server: prompt (a later turn's history
    included) and answer; specs whose prompt length the workload does not know are skipped,
    and so are a session's turns after one."""
    history: dict[str, int | None] = {}
    for spec in specs:
        p = spec.prompt_tokens
        if spec.session_id is None:
            if p is not None:
                yield spec, p + spec.max_tokens
            continue
        before = history.get(spec.session_id, 0) if spec.turn else 0
        if p is None or before is None:
            history[spec.session_id] = None
            continue
        yield spec, turn_context(before, spec.turn, p, spec.max_tokens)
        history[spec.session_id] = before + p + spec.max_tokens


def check_context(cfg: RunConfig, ep: EndpointConfig, info: ServerInfo) -> None:
    """Raise ``ConfigError`` when one of the first ``SCAN`` requests cannot fit the server's
    context (module docstring); nothing when the server did not say its context."""
    limit = info.max_model_len
    if limit is None:
        return
    from loadlab.workloads import build_requests

    # requested lengths only: no sizing, so nothing asked and no prompt fitted
    scan = cfg.replace(endpoints=(ep,))
    checked = list(itertools.islice(_needs(build_requests(scan, read_ahead=0)), SCAN))
    over = [(s, n) for s, n in checked if n > limit]
    if not over:
        return
    spec, need = max(over, key=lambda x: x[1])
    own = spec.prompt_tokens or 0
    prompt = need - spec.max_tokens
    what = (f"prompt {prompt:,} tokens" if prompt == own else
            f"prompt {prompt:,} tokens (turn {spec.turn}: this message {own:,}, the rest the "
            "session's history)")  # fmt: skip
    head = (f"endpoint {ep.name}: {len(over):,} of the first {len(checked):,} requests cannot "
            f"fit the server's context of {limit:,} tokens (max_model_len, {info.source}); "
            f"the longest, {spec.request_id}: {what} + max_tokens {spec.max_tokens:,} = "
            f"{need:,}.")  # fmt: skip
    kind = str(cfg.workload.get("kind", "synthetic"))
    if spec.session_id is not None and kind in _SESSION_KINDS:
        fix = (f"set workload.max_context_tokens = {limit} (a session then ends before a turn "
               "that would not fit), or shorten the messages and answers")  # fmt: skip
    else:
        fix = (f"lower --prompt-tokens / --max-tokens (or the workload's max_prompt_tokens and "
               f"max_output_tokens) so that prompt + answer <= {limit:,}")  # fmt: skip
    raise ConfigError(f"{head} Fix: {fix}; or use a server with a longer context.")


def preflight(cfg: RunConfig) -> tuple[RunConfig, dict[str, ServerInfo], list[str]]:
    """Ask every endpoint once: ``cfg`` with the served models filled in, each endpoint's
    ``ServerInfo`` by name, and notes to print; raises ``ConfigError`` for a request that
    cannot fit (``check_context``)."""
    infos: dict[str, ServerInfo] = {}
    notes: list[str] = []
    endpoints = []
    for ep in cfg.endpoints:
        info = server_info(ep)
        ep, note = served_model(ep, info)
        if note:
            notes.append(note)
        check_context(cfg, ep, info)
        infos[ep.name] = info
        endpoints.append(ep)
    return cfg.replace(endpoints=tuple(endpoints)), infos, notes
