"""A server's Prometheus ``/metrics`` text, read: the parser and the common series.

``parse_prometheus_text`` turns one page into ``{"name{labels}": value}``; ``server_series``
maps the names of vLLM, SGLang, TGI and the reference server onto common series (queue depth,
running batch, KV-cache use, prefix-cache hit rate) for the report's plots. Pure: the samples
come from ``loadlab._runner.scrape.PrometheusScraper`` during a run, or from a results file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SERIES_NAMES", "parse_prometheus_text", "server_series", "split_key"]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"")
_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n"}


# Common series -> exact names known from each server (first match wins), then a pattern.
SERIES_NAMES: dict[str, tuple[tuple[str, ...], re.Pattern[str]]] = {
    "queue_depth": (
        (
            "vllm:num_requests_waiting",
            "sglang:num_queue_reqs",
            "tgi_queue_size",
            "loadlab_server_queue_depth",
        ),
        re.compile(r"(queue_(depth|size|len)|requests_waiting|num_waiting|waiting_requests)$"),
    ),
    "running_batch": (
        (
            "vllm:num_requests_running",
            "sglang:num_running_reqs",
            "tgi_batch_current_size",
            "loadlab_server_running_requests",
        ),
        re.compile(
            r"(running_batch(_size)?|requests_running|running_requests|num_running(_reqs)?|batch_size)$"
        ),
    ),
    "kv_cache_use": (
        (
            "vllm:gpu_cache_usage_perc",
            "vllm:kv_cache_usage_perc",
            "sglang:token_usage",
        ),
        re.compile(r"(kv_cache_usage(_perc|_ratio)?|cache_usage_perc|kv_usage)$"),
    ),
}
_KV_USED = re.compile(r"kv_blocks_used$")
# Prefix-cache hits: a gauge where the server has one, else (hits, queries) counter pairs whose
# increments between two samples give the hit rate of the prompt tokens looked up in between.
_PREFIX_RATE = ("sglang:cache_hit_rate",)
_PREFIX_COUNTERS = (
    ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
    ("loadlab_server_prefix_cache_hits_total", "loadlab_server_prefix_cache_queries_total"),
)


def _parse_labels(s: str, i: int) -> tuple[dict[str, str], int]:
    """Labels from ``s[i]`` == "{" to the matching "}"; returns (labels, index after "}")."""
    labels: dict[str, str] = {}
    i += 1
    while True:
        while i < len(s) and s[i] in " \t,":
            i += 1
        if i < len(s) and s[i] == "}":
            return labels, i + 1
        m = _LABEL_NAME.match(s, i)
        if m is None:
            raise ValueError(f"bad label at column {i}")
        i = m.end()
        value = []
        while i < len(s) and s[i] != '"':
            if s[i] == "\\" and i + 1 < len(s):
                value.append(_UNESCAPE.get(s[i + 1], "\\" + s[i + 1]))
                i += 2
            else:
                value.append(s[i])
                i += 1
        if i >= len(s):
            raise ValueError("unterminated label value")
        labels[m.group(1)] = "".join(value)
        i += 1


def _key(name: str, labels: Mapping[str, str]) -> str:
    if not labels:
        return name
    body = ",".join(
        f'{k}="{v}"'.replace("\n", "\\n")
        for k, v in sorted(
            (k, v.replace("\\", "\\\\").replace('"', '\\"')) for k, v in labels.items()
        )
    )
    return f"{name}{{{body}}}"


def parse_prometheus_text(text: str, errors: list[str] | None = None) -> dict[str, float]:
    """Parse the Prometheus text exposition format into ``{"name{a="x",b="y"}": value}``.

    Labels are sorted by name so keys are stable; ``# HELP``/``# TYPE`` comments and blank
    lines are skipped; a histogram's ``_bucket``/``_sum``/``_count`` lines are separate keys;
    timestamps after the value are ignored. A malformed line is skipped (and described in
    ``errors`` when a list is given), so one bad line loses nothing else.

    >>> parse_prometheus_text('q{b="2",a="1"} 3\\n# TYPE x gauge\\nx 1.5 1700000000000')
    {'q{a="1",b="2"}': 3.0, 'x': 1.5}
    """
    out: dict[str, float] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            m = _NAME.match(line)
            if m is None:
                raise ValueError("no metric name")
            labels: dict[str, str] = {}
            i = m.end()
            if i < len(line) and line[i] == "{":
                labels, i = _parse_labels(line, i)
            fields = line[i:].split()
            if not fields:
                raise ValueError("no value")
            out[_key(m.group(0), labels)] = float(fields[0])
        except ValueError as exc:
            if errors is not None:
                errors.append(f"line {lineno}: {exc}: {raw[:120]!r}")
    return out


def split_key(key: str) -> tuple[str, dict[str, str]]:
    """A key of ``parse_prometheus_text`` back into its name and labels.

    >>> split_key('DCGM_FI_DEV_GPU_UTIL{UUID="GPU-1",gpu="0"}')
    ('DCGM_FI_DEV_GPU_UTIL', {'UUID': 'GPU-1', 'gpu': '0'})
    """
    name, brace, _ = key.partition("{")
    return (name, _parse_labels(key, len(name))[0]) if brace else (name, {})


def _base(key: str) -> str:
    return key.split("{", 1)[0]


def _pick(names: Sequence[str], exact: Sequence[str], pattern: re.Pattern[str]) -> str | None:
    for n in exact:
        if n in names:
            return n
    return next((n for n in sorted(names) if pattern.search(n)), None)


def server_series(
    samples: Sequence[Mapping[str, Any]],
) -> dict[str, tuple[list[float], list[float], str]]:
    """``{"queue_depth"|"running_batch"|"kv_cache_use"|"prefix_cache_hit_rate":
    (t_s, values, source name)}``.

    Series with several label sets (one per model or engine) are summed; KV-cache use is a
    fraction in [0, 1] (vLLM's ``*_perc`` gauges are fractions despite the name), derived
    from ``*kv_blocks_used / *kv_blocks_total`` where no usage gauge exists. The prefix-cache
    hit rate is a fraction of the prompt tokens looked up since the previous sample (vLLM's
    hit and query counters), or the server's own gauge (SGLang); a sample with no lookups since
    the previous one has no point.
    """
    names = sorted({_base(k) for s in samples for k in s.get("metrics", {})})
    out: dict[str, tuple[list[float], list[float], str]] = {}
    for series, (exact, pattern) in SERIES_NAMES.items():
        name = _pick(names, exact, pattern)
        if name is not None:
            out[series] = _collect(samples, lambda m, n=name: _sum(m, n), name)
    if "kv_cache_use" not in out:
        used = next((n for n in names if _KV_USED.search(n)), None)
        total = used[: -len("used")] + "total" if used else None
        if used and total in names:

            def frac(m: Mapping[str, float], u: str = used, t: str = total) -> float | None:
                tv, uv = _sum(m, t), _sum(m, u)
                return uv / tv if tv and uv is not None else None

            out["kv_cache_use"] = _collect(samples, frac, f"{used} / {total}")
    prefix = _prefix_hit_rate(samples, names)
    if prefix is not None:
        out["prefix_cache_hit_rate"] = prefix
    return out


def _prefix_hit_rate(
    samples: Sequence[Mapping[str, Any]], names: Sequence[str]
) -> tuple[list[float], list[float], str] | None:
    gauge = next((n for n in _PREFIX_RATE if n in names), None)
    if gauge is not None:
        return _collect(samples, lambda m, n=gauge: _sum(m, n), gauge)
    pair = next((p for p in _PREFIX_COUNTERS if p[0] in names and p[1] in names), None)
    if pair is None:
        return None
    hits_name, queries_name = pair
    ts: list[float] = []
    vs: list[float] = []
    prev: tuple[float, float] | None = None
    for s in samples:
        m = s.get("metrics", {})
        hits, queries = _sum(m, hits_name), _sum(m, queries_name)
        if hits is None or queries is None:
            continue
        # Counters start at zero with the server, so the first sample covers everything so far.
        d_hits, d_queries = (hits, queries) if prev is None else (hits - prev[0], queries - prev[1])
        prev = (hits, queries)
        if d_queries > 0:
            ts.append(s["t_ns"] / 1e9)
            vs.append(d_hits / d_queries)
    return ts, vs, f"{hits_name} / {queries_name} (per interval)"


def _sum(metrics: Mapping[str, float], name: str) -> float | None:
    vals = [v for k, v in metrics.items() if _base(k) == name]
    return sum(vals) if vals else None


def _collect(
    samples: Sequence[Mapping[str, Any]], fn: Any, source: str
) -> tuple[list[float], list[float], str]:
    ts, vs = [], []
    for s in samples:
        v = fn(s.get("metrics", {}))
        if v is not None:
            ts.append(s["t_ns"] / 1e9)
            vs.append(float(v))
    return ts, vs, source
