"""Checking ``[workload]`` parameters: unknown keys, types, paths. Shared by every kind.

Errors are ``WorkloadError`` (``loadlab.errors``, a ``ValueError``) whose message names the
key, the value and the fix; ``loadlab.scenario`` prefixes the scenario file's name.

Example::

    >>> check_keys("chat", {"sesions": 3}, {"sessions", "turns"})
    Traceback (most recent call last):
    ...
    loadlab.errors.WorkloadError: workload.sesions: unknown key for kind 'chat'; did you mean 'sessions'?
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadlab.errors import WorkloadError

__all__ = [
    "PACKAGE_DATA",
    "REPO_ROOT",
    "RUN_SETTINGS",
    "TRACES",
    "WorkloadError",
    "check_keys",
    "closest",
    "get_bool",
    "get_float",
    "get_int",
    "resolve_path",
    "trace_file",
]

PACKAGE_DATA = Path(__file__).resolve().parent.parent / "data"
# The checkout root (…/loadlab/workloads/_params.py -> …): relative paths are also found there.
REPO_ROOT = Path(__file__).resolve().parent.parent.parent
# Traces shipped in the package (loadlab/data/LICENSES.md), by the name a scenario gives
TRACES = {
    "azure-2023-conv": PACKAGE_DATA / "traces" / "AzureLLMInferenceTrace_conv.csv",
    "azure-2023-code": PACKAGE_DATA / "traces" / "AzureLLMInferenceTrace_code.csv",
}

# keys that belong to the run, not to a workload table: where to write them instead
RUN_SETTINGS = {
    "tokenizer": "the tokenizer is a setting of the run, not of its workload: write "
    "`tokenizer = ...` at the top of the scenario file (before any [table]), give --tokenizer, "
    "or RunConfig(tokenizer=...)",
}


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The valid name nearest to a typo, or None when nothing is close."""
    found = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def check_keys(
    where: str, params: Mapping[str, Any], allowed: Iterable[str], prefix: str = "workload."
) -> None:
    """Raise for the first key of ``params`` not in ``allowed``, naming the closest valid key.

    ``where`` is a kind name ("chat") or a phrase ("dist 'normal'")."""
    allowed = set(allowed)
    for key in params:
        if key in RUN_SETTINGS and key not in allowed:
            raise WorkloadError(f"{prefix}{key}: {RUN_SETTINGS[key]}")
        if key not in allowed:
            hint = closest(key, allowed)
            fix = f"did you mean {hint!r}?" if hint else f"valid keys: {', '.join(sorted(allowed))}"
            what = f"kind {where!r}" if " " not in where else where
            raise WorkloadError(f"{prefix}{key}: unknown key for {what}; {fix}")


def _typed(
    params: Mapping[str, Any], key: str, default: Any, prefix: str, kind: Any, noun: str
) -> tuple[str, Any]:
    """The parameter's full name and value (``None`` when absent without a default). A value
    not of ``kind`` is an error, and so is a bool: YAML's ``true`` is an int to Python."""
    value = params.get(key, default)
    name = prefix + key
    if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
        raise WorkloadError(f"{name} = {value!r}: must be {noun}")
    return name, value


def get_int(
    params: Mapping[str, Any],
    key: str,
    default: int | None,
    *,
    minimum: int = 1,
    prefix: str = "workload.",
) -> Any:
    """An integer parameter >= ``minimum`` (or the default when absent)."""
    key, value = _typed(params, key, default, prefix, int, "a whole number")
    if value is None:
        return None
    if value < minimum:
        raise WorkloadError(f"{key} = {value}: must be >= {minimum}")
    return value


def get_float(
    params: Mapping[str, Any],
    key: str,
    default: float | None,
    *,
    positive: bool = True,
    prefix: str = "workload.",
) -> Any:
    """A number parameter (> 0 when ``positive``, else >= 0), or the default when absent."""
    key, value = _typed(params, key, default, prefix, int | float, "a number")
    if value is None:
        return None
    if positive and not value > 0:
        raise WorkloadError(f"{key} = {value}: must be > 0")
    if not positive and not value >= 0:
        raise WorkloadError(f"{key} = {value}: must be >= 0")
    return float(value)


def get_bool(
    params: Mapping[str, Any], key: str, default: bool, *, prefix: str = "workload."
) -> bool:
    value = params.get(key, default)
    key = prefix + key
    if not isinstance(value, bool):
        raise WorkloadError(f"{key} = {value!r}: must be true or false")
    return value


def resolve_path(value: str | Path, key: str, bases: Sequence[Path] = ()) -> Path:
    """Find a data file: absolute as is; relative against ``bases`` (the scenario file's
    folder first), then the working directory, then the checkout root. The first existing
    candidate wins; none existing is an error listing every place looked."""
    path = Path(value).expanduser()
    if path.is_absolute():
        candidates = [path]
    else:
        candidates = [b / path for b in (*bases, Path.cwd(), REPO_ROOT)]
    for c in candidates:
        if c.is_file() or c.is_dir():  # a folder: a dataset saved by HF save_to_disk
            return c.resolve()
    tried = ", ".join(dict.fromkeys(str(c) for c in candidates))
    raise WorkloadError(
        f"{key} = {str(value)!r}: file not found (looked at {tried}); "
        f"give a path relative to the scenario file or the repository root, or an absolute one"
    )


def trace_file(value: str | Path, key: str, bases: Sequence[Path] = ()) -> Path:
    """A trace shipped with loadlab by its name (``TRACES``: ``azure-2023-conv``,
    ``azure-2023-code``), else a file found as ``resolve_path`` finds it."""
    if str(value) in TRACES:
        return TRACES[str(value)]
    return resolve_path(value, key, bases)
