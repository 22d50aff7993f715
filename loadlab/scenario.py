"""Scenario files: a whole run in TOML (``loadlab run --scenario scenarios/chat.toml``).

Top-level keys are ``RunConfig`` field names; ``[[endpoints]]`` tables hold ``url``, ``name``,
``model``, ``api``, ``api_key_env``, ``headers``; ``[workload]`` holds ``kind`` and that kind's
keys (``loadlab.workloads``). The file is checked at the edge (pydantic for types, then the
value rules below, then the workload's own keys and files); every problem is a
``ScenarioError`` naming the file, the key, the value and the fix, e.g.::

    scenarios/chat.toml: rate_rps = -1: must be > 0; for closed loop set concurrency instead
    scenarios/chat.toml: rate_rsp: unknown key; did you mean 'rate_rps'?

Relative file paths in ``[workload]`` and ``tokenizer`` are looked up next to the scenario
file, then in the working directory, then in the repository root, and stored absolute.

Example::

    cfg = load_scenario("scenarios/chat.toml", overrides={"rate_rps": 2.0})
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pydantic

from loadlab._headers import public_url
from loadlab.config import APIS, EndpointConfig, RunConfig
from loadlab.errors import ScenarioError, read_toml
from loadlab.workloads import resolve_workload_paths, validate_workload
from loadlab.workloads._arrivals import PROCESSES
from loadlab.workloads._params import WorkloadError, closest
from loadlab.workloads._tokenizers import resolve_tokenizer

__all__ = ["ScenarioError", "load_scenario", "scenario_from_dict"]


class _Endpoint(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)
    url: str
    name: str = "default"
    model: str = "loadlab-ref"
    api: str = "chat"
    api_key_env: str | None = None
    headers: dict[str, str] = {}


def _scenario_model() -> type[pydantic.BaseModel]:
    """A pydantic model with one field per ``RunConfig`` field (kept in step automatically)."""
    hints = typing.get_type_hints(RunConfig)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(RunConfig):
        hint: Any = hints[f.name]
        if f.name == "endpoints":
            hint = list[_Endpoint]
        elif typing.get_origin(hint) is Mapping:
            hint = dict[str, Any]
        elif typing.get_origin(hint) is tuple:  # TOML has arrays; strict pydantic wants lists
            hint = list[typing.get_args(hint)[0]]  # type: ignore[misc]
        fields[f.name] = (hint | None, None)  # absent keys keep RunConfig's defaults
    return pydantic.create_model(
        "Scenario", __config__=pydantic.ConfigDict(extra="forbid", strict=True), **fields
    )


_MODEL = _scenario_model()
_FIELDS = {f.name for f in dataclasses.fields(RunConfig)}

# key -> (is the value fine?, what is wrong and how to fix it)
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "rate_rps": (lambda v: v > 0, "must be > 0; for closed loop set concurrency instead"),
    "concurrency": (lambda v: v >= 1, "must be >= 1; for open loop set rate_rps instead"),
    "arrival": (lambda v: v in PROCESSES, f"choose one of {', '.join(PROCESSES)}"),
    "cv": (lambda v: v > 0, "must be > 0 (1 = Poisson; > 1 bursty)"),
    "max_in_flight": (lambda v: v >= 1, "must be >= 1 (or leave it out: no cap)"),
    "duration_s": (lambda v: v > 0, "must be > 0 seconds"),
    "requests": (lambda v: v >= 1, "must be >= 1"),
    "warmup_s": (lambda v: v >= 0, "must be >= 0 seconds"),
    "cooldown_s": (lambda v: v >= 0, "must be >= 0 seconds"),
    "prompt_tokens": (lambda v: v >= 1, "must be >= 1"),
    "max_tokens": (lambda v: v >= 1, "must be >= 1"),
    "timeout_s": (lambda v: v > 0, "must be > 0 seconds"),
    "read_timeout_s": (lambda v: v > 0, "must be > 0 seconds"),
    "workers": (lambda v: v >= 1, "must be >= 1"),
    "scrape_interval_s": (lambda v: v > 0, "must be > 0 seconds"),
    "saturation_lag_ms": (lambda v: v > 0, "must be > 0 ms"),
    "max_event_bytes": (lambda v: 1024 <= v <= 1 << 30, "must be between 1024 and 2**30 bytes"),
}


def _show(value: Any) -> str:
    """A value as it would be written in TOML."""
    if isinstance(value, str | bool) or value is None:
        return json.dumps(value)
    return repr(value)


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _pydantic_problems(source: str, exc: pydantic.ValidationError) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if p not in ("list[_Endpoint]",))
        where = _loc(loc)
        if err["type"] == "extra_forbidden":
            valid = _FIELDS if len(loc) == 1 else set(_Endpoint.model_fields)
            hint = closest(str(loc[-1]), valid)
            fix = f"did you mean {hint!r}?" if hint else f"valid keys: {', '.join(sorted(valid))}"
            problems.append(f"{source}: {where}: unknown key; {fix}")
        else:
            problems.append(f"{source}: {where} = {_show(err.get('input'))}: {err['msg'].lower()}")
    return problems


def _value_problems(source: str, data: Mapping[str, Any], raw: Mapping[str, Any]) -> list[str]:
    problems = []
    for key, (ok, fix) in _RULES.items():
        value = data.get(key)
        if value is not None and not ok(value):
            problems.append(f"{source}: {key} = {_show(raw.get(key, value))}: {fix}")
    has_rate, has_conc = data.get("rate_rps") is not None, data.get("concurrency") is not None
    if has_rate and has_conc:
        problems.append(
            f"{source}: rate_rps and concurrency are both set: keep rate_rps for open loop "
            f"(requests/s) or concurrency for closed loop, not both"
        )
    elif not has_rate and not has_conc:
        problems.append(
            f"{source}: no load given: set rate_rps = N (open loop, requests/s) or "
            f"concurrency = N (closed loop)"
        )
    if data.get("duration_s") is None and data.get("requests") is None:
        problems.append(
            f"{source}: no stop rule: set duration_s = SECONDS or requests = N (or both)"
        )
    for i, ep in enumerate(data.get("endpoints") or []):
        if ep.get("api", "chat") not in APIS:
            problems.append(
                f"{source}: endpoints[{i}].api = {_show(ep['api'])}: choose one of {', '.join(APIS)}"
            )
        if not str(ep.get("url", "")).startswith(("http://", "https://")):
            problems.append(
                f"{source}: endpoints[{i}].url = {_show(public_url(str(ep.get('url'))))}: must start with "
                f"http:// or https://"
            )
    return problems


def _apply_overrides(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Flags win over the file; giving one load mode clears the other."""
    given = {k: v for k, v in overrides.items() if v is not None}
    out = {**data, **given}
    if "rate_rps" in given and "concurrency" not in given:
        out.pop("concurrency", None)
    if "concurrency" in given and "rate_rps" not in given:
        out.pop("rate_rps", None)
    return out


def scenario_from_dict(
    data: Mapping[str, Any],
    *,
    source: str = "<scenario>",
    bases: tuple[Path, ...] = (),
    overrides: Mapping[str, Any] | None = None,
) -> RunConfig:
    """A ``RunConfig`` from parsed TOML (``source`` names the file in messages)."""
    merged = _apply_overrides(dict(data), overrides or {})
    try:
        model = _MODEL.model_validate(merged)
    except pydantic.ValidationError as exc:
        raise ScenarioError("\n".join(_pydantic_problems(source, exc))) from None
    values = {k: v for k, v in model.model_dump().items() if k in merged}
    problems = _value_problems(source, values, merged)
    if problems:
        raise ScenarioError("\n".join(problems))
    if "redact_headers" in values:
        values["redact_headers"] = tuple(values["redact_headers"])
    try:
        if "endpoints" in values:  # a header with CR, LF or NUL is refused here
            values["endpoints"] = tuple(EndpointConfig(**ep) for ep in values["endpoints"])
        cfg = RunConfig(**values)
        workload = resolve_workload_paths(cfg.workload, bases)
        cfg = cfg.replace(workload=workload, tokenizer=resolve_tokenizer(cfg.tokenizer, bases))
        validate_workload(cfg, bases)
    except WorkloadError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    except ValueError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    return cfg


def load_scenario(path: str | Path, *, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Read and check a scenario file; ``overrides`` (CLI flags, ``None`` = not given) win.

    Raises ``ScenarioError`` (a ``ValueError``) with a message fit to print as is."""
    p = Path(path)
    if not p.is_file():
        raise ScenarioError(f"{p}: scenario file not found")
    data = read_toml(p, ScenarioError, "scenario file")
    return scenario_from_dict(data, source=str(p), bases=(p.resolve().parent,), overrides=overrides)
