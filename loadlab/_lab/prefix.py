"""The lab's prefix-cache experiment: what a cached prefix buys, on the reference server.

Two questions, each answered with the ``prefix`` workload (``loadlab.workloads._prefix``) against
the reference server in continuous mode, each point salted (``cache_bust``) so it starts cold:

- **TTFT against prefix length, caching on and off**: one shared prefix of each length and
  short suffixes, one request at a time; TTFT p50 of the requests that hit (caching on)
  against every request's (caching off, ``--prefix-caching off``). A cached prefix turns
  its compute-bound prefill into a lookup, so the "on" column stays flat while "off" grows
  with the prefix.
- **Throughput at hit rates 0, 50 and 90 %**: prompts of one length whose shared prefix is
  sized for the target hit rate, closed loop; output tokens/s and requests/s, with the hit
  rate expected from the prompts beside the one the server's counters measured.

Usage::

    loadlab lab --prefix-cache                       # cpu preset (minutes on 2 cores)
    loadlab lab --prefix-cache --quick               # tiny preset, seconds (the tests)

Writes ``<out>/prefix.md`` and ``prefix.json`` and one results file per point
(``prefix-ttft-on-512.json``, ``prefix-throughput-90.json``, ...).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadlab._analysis.prefix_cache import prefix_cache_summary
from loadlab._analysis.summary import summarize
from loadlab.config import EndpointConfig, RunConfig
from loadlab.results import Results, write_results

__all__ = [
    "PrefixLabSettings",
    "hit_rate_workload",
    "prefix_lab",
    "prefix_settings",
    "render_prefix_markdown",
]

BLOCK_SIZE = 16  # the reference server's default --block-size


@dataclass(frozen=True)
class PrefixLabSettings:
    preset: str
    prefix_lengths: tuple[int, ...]  # TTFT experiment: one shared prefix of each length
    suffix_tokens: int
    ttft_requests: int  # per length and setting, one at a time (the first is the cold one)
    prompt_tokens: int  # throughput experiment: every prompt this long
    hit_rates: tuple[float, ...]
    throughput_requests: int
    concurrency: int
    output_tokens: int
    threads: int
    seed: int = 0


def prefix_settings(preset: str = "cpu", quick: bool = False) -> PrefixLabSettings:
    """The cpu preset's settings (or the tiny preset's with ``quick``: seconds, the tests)."""
    if quick:
        return PrefixLabSettings("tiny", (64, 256, 512), 32, 6, 512, (0.0, 0.5, 0.9), 40, 4, 4, 1)
    return PrefixLabSettings(preset, (128, 512, 1024, 2048), 64, 8, 1024, (0.0, 0.5, 0.9), 60, 4, 16, max(1, (os.cpu_count() or 2) - 1))  # fmt: skip


def hit_rate_workload(target: float, prompt_tokens: int, requests: int) -> dict[str, Any]:
    """A ``prefix`` workload whose prompts of ``prompt_tokens`` tokens have the expected hit
    rate ``target``: prefixes of ``N`` tokens (whole blocks), each used by ``M`` requests, hit
    ``(M - 1) / M * N / prompt_tokens``. 0 % gives every request a prefix of its own.

    >>> wl = hit_rate_workload(0.5, 1024, 60)
    >>> (wl["prefixes"], wl["prefix_tokens"], wl["suffix_tokens"])
    (3, 544, 480)
    """
    if target <= 0:
        return {"kind": "prefix", "prefixes": requests, "requests_per_prefix": 1,
                "prefix_tokens": prompt_tokens // 2, "suffix_tokens": prompt_tokens - prompt_tokens // 2}  # fmt: skip
    per = 20  # M: 95 % of a group's requests hit
    n = -(-round(target * prompt_tokens * per / (per - 1)) // BLOCK_SIZE) * BLOCK_SIZE
    n = min(n, prompt_tokens - BLOCK_SIZE)
    return {"kind": "prefix", "prefixes": -(-requests // per), "requests_per_prefix": per,
            "prefix_tokens": n, "suffix_tokens": prompt_tokens - n}  # fmt: skip


def _config(s: PrefixLabSettings, url: str, workload: dict[str, Any], **fields: Any) -> RunConfig:
    wl = {**workload, "cache_bust": True, "block_size": BLOCK_SIZE, "order": "grouped",
          "output_tokens": s.output_tokens, "exact_output": True}  # fmt: skip
    ep = EndpointConfig(url=url, name="reference", api="completions")
    return RunConfig(endpoints=(ep,), seed=s.seed, progress=False, scrape=url + "/metrics",
                     scrape_interval_s=0.5, workload=wl, timeout_s=600.0, **fields)  # fmt: skip


@contextmanager
def _server(s: PrefixLabSettings, caching: bool) -> Iterator[str]:
    from reference_server.launch import start_server

    extra = ["--prefix-caching", "on" if caching else "off", "--threads", str(s.threads)]
    with start_server(mode="continuous", preset=s.preset, extra_args=extra, timeout_s=300) as srv:
        yield str(srv.url)


def _point(results: Results) -> dict[str, Any]:
    """One point's figures: TTFT p50 (all, hit, missed), throughput, hit rates."""
    summary = summarize(results)
    pc = prefix_cache_summary(results)
    return {
        "ttft_p50_ms": summary.ttft_ms.at(50),
        "ttft_p50_cached_ms": pc.ttft_cached_ms.at(50) if pc else None,
        "ttft_p50_uncached_ms": pc.ttft_uncached_ms.at(50) if pc else None,
        "output_tokens_per_s": summary.throughput.output_tokens_per_s,
        "requests_per_s": summary.throughput.requests_per_s,
        "expected_hit_rate": pc.expected_hit_rate if pc else None,
        "server_hit_rate": pc.server_hit_rate if pc else None,
        "failed": summary.counts.failed,
    }


def prefix_lab(s: PrefixLabSettings, out: Path, log: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """Run both experiments; write every results file and return the figures as plain data."""
    from loadlab.api import run_sync

    out.mkdir(parents=True, exist_ok=True)
    ttft: list[dict[str, Any]] = []
    throughput: list[dict[str, Any]] = []
    for caching in (True, False):
        with _server(s, caching) as url:
            label = "on" if caching else "off"
            for n in s.prefix_lengths:
                log(f"prefix lab: TTFT, caching {label}, prefix {n} tokens")
                wl = {"kind": "prefix", "prefixes": 1, "prefix_tokens": n,
                      "suffix_tokens": s.suffix_tokens}  # fmt: skip
                res = run_sync(_config(s, url, wl, concurrency=1, requests=s.ttft_requests))
                write_results(res, out / f"prefix-ttft-{label}-{n}.json")
                ttft.append({"caching": label, "prefix_tokens": n, **_point(res)})
            if not caching:
                continue
            for rate in s.hit_rates:
                log(f"prefix lab: throughput at an expected hit rate of {rate:.0%}")
                wl = hit_rate_workload(rate, s.prompt_tokens, s.throughput_requests)
                cfg = _config(s, url, wl, concurrency=s.concurrency, requests=s.throughput_requests)  # fmt: skip
                res = run_sync(cfg)
                write_results(res, out / f"prefix-throughput-{round(rate * 100)}.json")
                throughput.append({"target_hit_rate": rate, **wl, **_point(res)})
    data = {"settings": asdict(s), "ttft": ttft, "throughput": throughput,
            "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None}  # fmt: skip
    (out / "prefix.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    (out / "prefix.md").write_text(render_prefix_markdown(data), encoding="utf-8")
    return data


def _n(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def render_prefix_markdown(data: dict[str, Any]) -> str:
    """The two tables: TTFT by prefix length (on, off, ratio) and throughput by hit rate."""
    on = {r["prefix_tokens"]: r for r in data["ttft"] if r["caching"] == "on"}
    off = {r["prefix_tokens"]: r for r in data["ttft"] if r["caching"] == "off"}
    lines = ["### TTFT against prefix length (p50, ms; caching on: the requests that hit)", "",
             "| prefix tokens | caching on | caching off | on / off | hit rate expected | measured |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for n in sorted(on.keys() | off.keys()):
        a, b = on.get(n, {}), off.get(n, {})
        hit, miss = a.get("ttft_p50_cached_ms"), b.get("ttft_p50_ms")
        ratio = hit / miss if hit is not None and miss else None
        lines.append(f"| {n} | {_n(hit)} | {_n(miss)} | {_n(ratio, '{:.2f}')} | "
                     f"{_n(a.get('expected_hit_rate'), '{:.1%}')} | {_n(a.get('server_hit_rate'), '{:.1%}')} |")  # fmt: skip
    lines += ["", "### Throughput at hit rates 0, 50 and 90 % (caching on, closed loop)", "",
              "| target | expected | measured (server) | output tok/s | requests/s | TTFT p50 ms |",
              "| ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in data["throughput"]:
        lines.append(f"| {r['target_hit_rate']:.0%} | {_n(r['expected_hit_rate'], '{:.1%}')} | "
                     f"{_n(r['server_hit_rate'], '{:.1%}')} | {_n(r['output_tokens_per_s'])} | "
                     f"{_n(r['requests_per_s'], '{:.2f}')} | {_n(r['ttft_p50_ms'])} |")  # fmt: skip
    return "\n".join(lines) + "\n"
