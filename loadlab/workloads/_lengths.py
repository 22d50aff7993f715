"""Length and time distributions: fixed, uniform, normal, lognormal, exponential, empirical.

A distribution is written in a scenario as a number (fixed) or a table::

    prompt_tokens = 512                                            # fixed
    prompt_tokens = {dist = "uniform", low = 100, high = 900}
    prompt_tokens = {dist = "normal", mean = 500, std = 150}       # truncated below (see below)
    prompt_tokens = {dist = "lognormal", median = 400, sigma = 0.8, max = 4000}
    prompt_tokens = {dist = "lognormal", mean = 500, sigma = 0.8}  # or mu = 6.0, sigma = 0.8
    think_time_s  = {dist = "exponential", mean = 3.0}
    prompt_tokens = {dist = "empirical", file = "sharegpt", column = "num_prefill_tokens"}

Every kind takes ``min`` and ``max`` clamps (values outside are set to the bound). Lognormal:
``ln X ~ N(mu, sigma^2)``; ``median = e^mu``; ``mean = e^(mu + sigma^2/2)``, so giving ``mean``
sets ``mu = ln(mean) - sigma^2/2``. Normal is *truncated*, not clipped, at the floor (1 token for
lengths, 0 s for times, or ``min`` when higher): draws below it are redrawn, so the mass does not
pile up on the bound. Empirical draws rows of a CSV column uniformly with replacement;
``file = "sharegpt"``, ``"arxiv"`` and ``"azure_conv"`` (the Azure 2023 conversation trace's
lengths) name the copies in ``loadlab/data/``; ``scale``
multiplies the drawn values. All sampling goes through a seeded ``numpy.random.Generator``.

Example::

    >>> d = parse_dist({"dist": "uniform", "low": 10, "high": 20}, "prompt_tokens")
    >>> rng = np.random.default_rng(0)
    >>> all(10 <= x <= 20 for x in d.sample_int(rng, 100))
    True
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from loadlab.workloads._params import (
    PACKAGE_DATA,
    WorkloadError,
    check_keys,
    get_float,
    resolve_path,
)

__all__ = [
    "DATASETS",
    "DISTS",
    "Dist",
    "load_column",
    "parse_dist",
    "sample_pairs",
]

DATASETS = {
    "sharegpt": PACKAGE_DATA / "sharegpt_lengths.csv",
    "arxiv": PACKAGE_DATA / "arxiv_summarization_lengths.csv",
    "azure_conv": PACKAGE_DATA / "azure_conv_lengths.csv",
}
PROMPT_COLUMN = "num_prefill_tokens"
OUTPUT_COLUMN = "num_decode_tokens"

# dist name -> its parameter keys (besides dist, min, max)
DISTS: dict[str, tuple[str, ...]] = {
    "fixed": ("value",),
    "uniform": ("low", "high"),
    "normal": ("mean", "std"),
    "lognormal": ("mu", "median", "mean", "sigma"),
    "exponential": ("mean",),
    "empirical": ("file", "column", "scale"),
}


@dataclass(frozen=True)
class Dist:
    """A parsed distribution; ``sample`` gives floats, ``sample_int`` whole token counts."""

    kind: str
    params: Mapping[str, float] = field(default_factory=dict)
    # empirical sample (already scaled; read-only float64 array, not compared)
    values: np.ndarray = field(default_factory=lambda: np.zeros(0), compare=False)
    min: float | None = None
    max: float | None = None
    floor: float = 1.0  # lengths: 1 token; times: 0 s

    def __post_init__(self) -> None:
        if self.kind not in DISTS:
            raise ValueError(f"unknown dist {self.kind!r}; choose one of {', '.join(DISTS)}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")

    @property
    def lower(self) -> float:
        return max(self.floor, self.min) if self.min is not None else self.floor

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws (float64), clamped to [max(floor, min), max]."""
        p = self.params
        if self.kind == "fixed":
            x = np.full(n, p["value"], dtype=float)
        elif self.kind == "uniform":
            x = rng.uniform(p["low"], p["high"], n)
        elif self.kind == "normal":
            x = _truncated_normal(rng, p["mean"], p["std"], self.lower, n)
        elif self.kind == "lognormal":
            x = rng.lognormal(p["mu"], p["sigma"], n)
        elif self.kind == "exponential":
            x = rng.exponential(p["mean"], n)
        else:
            x = self.values[rng.integers(0, len(self.values), n)]
        return np.clip(x, self.lower, self.max if self.max is not None else np.inf)

    def sample_int(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` whole numbers (int64), rounded, >= 1 and within the clamps."""
        hi = math.floor(self.max) if self.max is not None else None
        x = np.rint(self.sample(rng, n)).astype(np.int64)
        return np.clip(x, max(1, math.ceil(self.lower)), hi)

    def mean(self) -> float:
        """The unclamped mean (for docs and sizing): lognormal e^(mu + sigma^2/2)."""
        p = self.params
        if self.kind == "fixed":
            return p["value"]
        if self.kind == "uniform":
            return (p["low"] + p["high"]) / 2
        if self.kind in ("normal", "exponential"):
            return p["mean"]
        if self.kind == "lognormal":
            return math.exp(p["mu"] + p["sigma"] ** 2 / 2)
        return float(np.mean(self.values))


def _truncated_normal(
    rng: np.random.Generator, mean: float, std: float, lower: float, n: int
) -> np.ndarray:
    """Normal draws conditioned on x >= lower, by rejection (a bounded number of rounds;
    anything still below after that is clamped, which only matters for a mean far below)."""
    x = rng.normal(mean, std, n)
    for _ in range(64):
        bad = x < lower
        if not bad.any():
            break
        x[bad] = rng.normal(mean, std, int(bad.sum()))
    return x


@lru_cache(maxsize=16)
def _read_column(path: Path, column: str) -> np.ndarray:
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None) or []
        if column not in header:
            raise WorkloadError(
                f"{path}: no column {column!r}; columns are {', '.join(header) or '(none)'}"
            )
        i = header.index(column)
        out = []
        for lineno, row in enumerate(reader, start=2):
            try:
                out.append(float(row[i]))
            except (ValueError, IndexError):
                raise WorkloadError(
                    f"{path}:{lineno}: column {column!r} is not a number: {row!r}"
                ) from None
    if not out:
        raise WorkloadError(f"{path}: column {column!r} has no values")
    arr = np.asarray(out, dtype=float)
    arr.setflags(write=False)  # cached and shared: nobody may change it
    return arr


def dataset_path(file: str, key: str, bases: Sequence[Path] = ()) -> Path:
    """``sharegpt`` / ``arxiv`` / ``azure_conv`` name the packaged copies; else a path."""
    return DATASETS[file] if file in DATASETS else resolve_path(file, key, bases)


def load_column(file: str, column: str, bases: Sequence[Path] = ()) -> np.ndarray:
    """Every value of one CSV column (cached), e.g. ``load_column("sharegpt", "num_decode_tokens")``."""
    return _read_column(dataset_path(file, "file", bases), column)


def parse_dist(spec: Any, key: str, *, integer: bool = True, bases: Sequence[Path] = ()) -> Dist:
    """A ``Dist`` from a scenario value: a number (fixed) or a table with ``dist = ...``."""
    floor = 1.0 if integer else 0.0
    if isinstance(spec, bool):
        raise WorkloadError(f"workload.{key} = {spec!r}: give a number or a {{dist = ...}} table")
    if isinstance(spec, int | float):
        if spec < floor:
            raise WorkloadError(f"workload.{key} = {spec}: must be >= {floor:g}")
        return Dist("fixed", {"value": float(spec)}, floor=floor)
    if not isinstance(spec, Mapping):
        raise WorkloadError(
            f"workload.{key} = {spec!r}: give a number or a table such as "
            f'{{dist = "lognormal", median = 400, sigma = 0.8}}'
        )
    prefix = f"workload.{key}."
    kind = spec.get("dist")
    if kind not in DISTS:
        raise WorkloadError(f"workload.{key}.dist = {kind!r}: choose one of {', '.join(DISTS)}")
    check_keys(f"dist {kind!r}", spec, {"dist", "min", "max", *DISTS[kind]}, prefix)
    lo = get_float(spec, "min", None, positive=False, prefix=prefix)
    hi = get_float(spec, "max", None, positive=False, prefix=prefix)
    if lo is not None and hi is not None and lo > hi:
        raise WorkloadError(f"workload.{key}: min ({lo:g}) must be <= max ({hi:g})")
    params = _dist_params(kind, spec, key, prefix)
    values = np.zeros(0)
    if kind == "empirical":
        file = spec.get("file", "sharegpt")
        column = spec.get("column", PROMPT_COLUMN)
        if not isinstance(file, str) or not isinstance(column, str):
            raise WorkloadError(f"{prefix}file and {prefix}column must be strings")
        path = dataset_path(file, f"{prefix}file", bases)
        scale = params.get("scale", 1.0)
        try:
            raw = _read_column(path, column)
        except WorkloadError as exc:
            raise WorkloadError(f"workload.{key}.column = {column!r}: {exc}") from None
        values = raw * scale if scale != 1.0 else raw
    return Dist(kind, params, values, lo, hi, floor)


def _dist_params(kind: str, spec: Mapping[str, Any], key: str, prefix: str) -> dict[str, float]:
    def need(name: str, positive: bool = True) -> float:
        if name not in spec:
            raise WorkloadError(
                f"workload.{key}: dist {kind!r} needs {name} (it takes {', '.join(DISTS[kind])})"
            )
        return float(get_float(spec, name, None, positive=positive, prefix=prefix))

    if kind == "fixed":
        return {"value": need("value")}
    if kind == "uniform":
        low, high = need("low", positive=False), need("high", positive=False)
        if low > high:
            raise WorkloadError(f"workload.{key}: low ({low:g}) must be <= high ({high:g})")
        return {"low": low, "high": high}
    if kind == "normal":
        return {"mean": need("mean", positive=False), "std": need("std")}
    if kind == "exponential":
        return {"mean": need("mean")}
    if kind == "empirical":
        return {"scale": float(get_float(spec, "scale", 1.0, prefix=prefix))}
    # lognormal: sigma plus exactly one of mu, median, mean
    sigma = need("sigma")
    given = [k for k in ("mu", "median", "mean") if k in spec]
    if len(given) != 1:
        raise WorkloadError(
            f"workload.{key}: lognormal needs sigma and exactly one of mu, median, mean "
            f"(got {', '.join(given) or 'none'})"
        )
    if given[0] == "mu":
        mu = float(get_float(spec, "mu", None, positive=False, prefix=prefix))
    elif given[0] == "median":
        mu = math.log(need("median"))
    else:
        mu = math.log(need("mean")) - sigma**2 / 2  # E[X] = e^(mu + sigma^2/2)
    return {"mu": mu, "sigma": sigma}


def sample_pairs(
    file: str,
    rng: np.random.Generator,
    n: int,
    *,
    columns: tuple[str, str] = (PROMPT_COLUMN, OUTPUT_COLUMN),
    bases: Sequence[Path] = (),
) -> np.ndarray:
    """``n`` rows of two columns drawn *together* (keeps the prompt/output correlation):
    an int64 array of shape [n, 2]."""
    a = load_column(file, columns[0], bases)
    b = load_column(file, columns[1], bases)
    idx = rng.integers(0, len(a), n)
    out = np.stack([a[idx], b[idx]], axis=1)
    return np.maximum(np.rint(out), 1).astype(np.int64)
