"""loadlab beside ``vllm bench serve`` on the same vLLM and the same workload: the parts that
``benchmarks/vs_vllm_bench.py`` (each tool judged by a packet capture) and the engine tests
(one short round) share.

vllm bench's random dataset is its own, and its prompts drift a token or two from the asked
length after decode and re-encode (and gain the chat template). loadlab is given exactly the
per-request lengths vLLM counted for vllm bench, in order, as a trace replayed closed loop at
the same concurrency with prompts made exact by ``--tokenizer``; so both send the same token
totals, each counted from the server's usage as its own tool recorded it.

The tiny model's weights are random, so most tokens it picks are single bytes of multi-byte
UTF-8 characters, which vLLM streams as chunks with empty text until the character completes.
vllm bench counts such a chunk as a token (in TTFT and ITL); loadlab does not (a chunk with no
text carries no visible token, ``docs/metrics.md``); a real model rarely sends one.
So both tools send the same ``allowed_token_ids``: the tokens that decode to whole ASCII text.

Usage::

    extra = {"allowed_token_ids": text_token_ids(model_dir)}
    bench, res = run_round(python, url, model_dir, BenchLoad(requests=64), work_dir, extra)
    bench_figures(bench), loadlab_figures(res)

(``run_round`` is ``run_vllm_bench``, ``write_lengths_trace`` and ``run_loadlab_on_trace`` in
turn; call them one by one to look between the steps.) With ``around=OnWire(...)`` it runs
the same round with each tool's run captured (``loadlab._wire``; root or CAP_NET_RAW), and
``OnWire.judge`` judges each tool's per-request figures against the wire's: loadlab's by the
``X-Request-Id`` it sends, vllm bench's by the ids it sends (``--request-id-prefix``; its
saved lists are in request order). vllm bench starts TTFT at the first chunk with
``choices``, a role-only one included, and counts every such chunk in ITL: it is judged
against the wire read its way (``vllm_bench``), and against the token events loadlab counts
(``vllm_bench_tokens``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadlab._wire.capture import Capture
from loadlab._wire.http import CHOICE, TOKEN, read_exchanges
from loadlab._wire.judge import Timings, judge, record_timings, wire_timings
from loadlab.results import Results, read_results
from tests.helpers.vllm_server import SERVED_MODEL

__all__ = [
    "METRICS",
    "BenchLoad",
    "OnWire",
    "WireRound",
    "bench_figures",
    "bench_timings",
    "loadlab_figures",
    "run_loadlab_on_trace",
    "run_round",
    "run_vllm_bench",
    "text_token_ids",
    "write_lengths_trace",
]

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("ttft_ms", "tpot_ms", "itl_ms")  # each tool's p50 of each
_ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
BENCH_ID_PREFIX = "vllm-bench-"  # its request i sends X-Request-Id BENCH_ID_PREFIX + str(i)


@dataclass(frozen=True)
class BenchLoad:
    """The side-by-side's workload: random 256 in / 64 out, concurrency 8, 200 requests."""

    requests: int = 200
    concurrency: int = 8
    input_len: int = 256
    output_len: int = 64
    seed: int = 0


def text_token_ids(model_dir: str | Path) -> list[int]:
    """Ids of the tokens that decode on their own to non-empty ASCII text (no special token,
    no lone byte of a multi-byte character)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    ids = []
    for i in range(tok.get_vocab_size()):
        text = tok.decode([i])
        if tok.id_to_token(i) not in special and text and all(32 <= ord(c) < 127 for c in text):
            ids.append(i)
    return ids


def run_vllm_bench(
    python: str | Path,
    url: str,
    model_dir: str | Path,
    load: BenchLoad,
    out: Path,
    extra_body: dict[str, Any],
    timeout_s: float = 900.0,
    cpus: str | None = None,
) -> dict[str, Any]:
    """One ``vllm bench serve`` run (vLLM's interpreter; on ``cpus`` only when given); its
    saved result, per request too. Raises RuntimeError when it fails or loses a request."""
    cmd = [
        str(python), "-m", "vllm.entrypoints.cli.main", "bench", "serve",
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
        "--base-url", url, "--model", SERVED_MODEL, "--tokenizer", str(model_dir),
        "--dataset-name", "random", "--random-input-len", str(load.input_len),
        "--random-output-len", str(load.output_len), "--num-prompts", str(load.requests),
        "--max-concurrency", str(load.concurrency), "--ignore-eos", "--seed", str(load.seed),
        "--extra-body", json.dumps(extra_body), "--disable-tqdm",
        "--request-id-prefix", BENCH_ID_PREFIX,
        "--save-result", "--save-detailed", "--result-dir", str(out.parent),
        "--result-filename", out.name,
    ]  # fmt: skip
    env = {**os.environ, **_ENV}
    proc = subprocess.run(
        pinned(cmd, cpus), env=env, capture_output=True, text=True, timeout=timeout_s
    )
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"vllm bench serve exited {proc.returncode}:\n{tail}")
    data: dict[str, Any] = json.loads(out.read_text())
    if data["completed"] != load.requests:
        raise RuntimeError(f"vllm bench serve: {data['failed']} of {load.requests} failed")
    return data


def pinned(cmd: list[str], cpus: str | None) -> list[str]:
    """``cmd`` under ``taskset -c cpus`` (``None``: as it is)."""
    return cmd if cpus is None else ["taskset", "-c", cpus, *cmd]


def write_lengths_trace(bench: dict[str, Any], path: Path) -> None:
    """vllm bench's per-request server-counted lengths as an Azure-format trace, in order
    (closed loop reads the lengths only; the times just have to increase)."""
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i, (p, o) in enumerate(zip(bench["input_lens"], bench["output_lens"], strict=True)):
        rows.append(f"2023-11-16 18:{i // 6000:02d}:{i // 100 % 60:02d}.{i % 100:02d}00000,{p},{o}")
    path.write_text("\n".join(rows) + "\n")


def run_loadlab_on_trace(
    url: str,
    model_dir: str | Path,
    trace: Path,
    load: BenchLoad,
    out: Path,
    extra_body: dict[str, Any],
    timeout_s: float = 900.0,
    cpus: str | None = None,
) -> Results:
    """``loadlab run`` (this interpreter, this checkout; on ``cpus`` only when given)
    replaying ``trace`` closed loop."""
    scenario = out.with_suffix(".toml")
    scenario.write_text(f'[workload]\nkind = "trace"\npath = {json.dumps(str(trace))}\n')
    cmd = [
        sys.executable, "-m", "loadlab", "run", "--scenario", str(scenario),
        "--endpoint", url, "--model", SERVED_MODEL, "--api", "chat",
        "--concurrency", str(load.concurrency), "--requests", str(load.requests),
        "--tokenizer", str(model_dir), "--seed", str(load.seed),
        # ignore_eos as vllm bench sends it (--exact-output would add min_tokens)
        "--extra-body", json.dumps({"ignore_eos": True, **extra_body}),
        "--out", str(out), "--no-progress",
    ]  # fmt: skip
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    proc = subprocess.run(
        pinned(cmd, cpus), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"loadlab run exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return read_results(out)


def bench_figures(data: dict[str, Any]) -> dict[str, float]:
    """vllm bench's medians (ms) and token totals (from the server's usage)."""
    return {
        "ttft_ms": data["median_ttft_ms"],
        "tpot_ms": data["median_tpot_ms"],
        "itl_ms": data["median_itl_ms"],
        "input_tokens": data["total_input_tokens"],
        "output_tokens": data["total_output_tokens"],
        "duration_s": data["duration"],
    }


def loadlab_figures(res: Results) -> dict[str, float]:
    """loadlab's p50s (ms) and token totals (from the server's usage)."""
    summary = res.to_dict()["summary"]
    if any(not r.ok for r in res.records):
        raise RuntimeError(f"loadlab: {sum(not r.ok for r in res.records)} requests failed")
    return {
        **{m: summary[m]["p50"] for m in METRICS},
        "input_tokens": sum(r.prompt_tokens or 0 for r in res.records),
        "output_tokens": sum(r.output_tokens or 0 for r in res.records),
        "duration_s": res.duration_ns / 1e9,
    }


def bench_timings(data: dict[str, Any]) -> Timings:
    """vllm bench's per-request figures (its saved lists, in request order; seconds), in ms,
    keyed by the ids it sent; failed requests left out."""
    ttft, itl, e2e = {}, {}, {}
    rows = zip(data["ttfts"], data["itls"], data["latencies"], data["errors"], strict=True)
    for i, (first, gaps, latency, error) in enumerate(rows):
        if not error and first:
            rid = f"{BENCH_ID_PREFIX}{i}"
            ttft[rid], itl[rid], e2e[rid] = first * 1e3, [g * 1e3 for g in gaps], latency * 1e3
    return Timings(ttft, itl, e2e)


def run_round(
    python: str | Path,
    url: str,
    model_dir: str | Path,
    load: BenchLoad,
    work: Path,
    extra_body: dict[str, Any],
    tag: str = "",
    cpus: str | None = None,
    around: Callable[[str], AbstractContextManager[Any]] = lambda _tool: nullcontext(),
) -> tuple[dict[str, Any], Results]:
    """One round: ``vllm bench serve``, then ``loadlab run`` on the lengths vLLM counted for
    it (both on ``cpus`` when given, each inside ``around("bench")``, ``around("loadlab")``);
    vllm bench's saved result and loadlab's results. Files go in ``work``, named with ``tag``
    (one per round)."""
    with around("bench"):
        bench = run_vllm_bench(
            python, url, model_dir, load, work / f"bench{tag}.json", extra_body, cpus=cpus
        )
    trace = work / f"lengths{tag}.csv"
    write_lengths_trace(bench, trace)
    out = work / f"loadlab{tag}.json"
    with around("loadlab"):
        res = run_loadlab_on_trace(url, model_dir, trace, load, out, extra_body, cpus=cpus)
    return bench, res


@dataclass
class WireRound:
    """One round with each tool's run captured; ``figures``: ``loadlab._wire.judge.judge``'s
    answer per tool (``loadlab``, ``vllm_bench``, ``vllm_bench_tokens``)."""

    bench: dict[str, Any]
    results: Results
    figures: dict[str, dict[str, Any]]
    dropped: int  # packets the kernel dropped in either capture (0: the wire is whole)


class OnWire:
    """``run_round``'s ``around`` that captures each tool's run on the loopback (pcap files
    kept in ``work``, named with ``tag``); ``judge`` then judges the round against the wire::

        wire = OnWire(url, work, tag)
        rnd = wire.judge(*run_round(python, url, model_dir, load, work, extra, tag, around=wire))
    """

    def __init__(self, url: str, work: Path, tag: str = "") -> None:
        self.port = int(url.rsplit(":", 1)[1].split("/")[0])
        self.work, self.tag = work, tag
        self.caps: dict[str, Capture] = {}

    def __call__(self, tool: str) -> Capture:
        self.caps[tool] = Capture(self.port, "lo", self.work / f"{tool}{self.tag}.pcap")
        return self.caps[tool]

    def judge(self, bench: dict[str, Any], res: Results) -> WireRound:
        _, on_wire = read_exchanges(self.caps["bench"].pcap, self.port)
        _, ours = read_exchanges(self.caps["loadlab"].pcap, self.port)
        figures = {
            "loadlab": judge(record_timings(res.records), wire_timings(ours)),
            "vllm_bench": judge(bench_timings(bench), wire_timings(on_wire, (TOKEN, CHOICE))),
            "vllm_bench_tokens": judge(bench_timings(bench), wire_timings(on_wire)),
        }
        dropped = sum(c.result.dropped if c.result else 0 for c in self.caps.values())
        return WireRound(bench, res, figures, dropped)
