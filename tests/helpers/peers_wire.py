"""GuideLLM and AIPerf on the side-by-side's workload (``BenchLoad``: random prompts of
``input_len`` tokens, ``output_len`` out with EOS ignored, closed loop at ``concurrency``),
each run as its user would and read from its own per-request output, to be judged against a
packet capture of the same run (``benchmarks/vs_vllm_bench.py``).

Neither tool sends a request id, so each request it recorded is joined to a wire exchange by
time (``join_by_time``): both tools stamp their requests with the wall clock
(``time.time()``), the clock the capture's kernel timestamps are read in.

What each tool reports per request, and so what it is judged on:

- TTFT: GuideLLM from when httpx starts writing the request headers to the first SSE line
  that carries a token; AIPerf from its request's start to its first response with content.
  Judged against the wire's TTFT (the request's last byte to the first token event).
- ITL: both report one figure per request, the mean gap, (last token - first token) /
  (output tokens - 1), output tokens as the server's usage counts them. Judged against the
  same mean of the wire's token events (``wire_mean_timings``), request by request.
- E2E: to the last token (GuideLLM's ``last_token_iteration``; AIPerf's last response).

Usage::

    out = run_peer("guidellm", exe, url, model_dir, load, work / "guidellm", extra)
    sent = guidellm_requests(out)
    joined = join_by_time(sent, exchanges)
    judge(peer_timings(sent, joined), wire_mean_timings(joined))
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadlab._wire.http import Exchange, read_exchanges
from loadlab._wire.judge import NS_PER_MS, Timings, answered, judge
from tests.helpers.vllm_bench import BenchLoad, pinned
from tests.helpers.vllm_server import SERVED_MODEL

__all__ = [
    "Sent",
    "aiperf_command",
    "aiperf_requests",
    "guidellm_command",
    "guidellm_requests",
    "join_by_time",
    "judge_peer",
    "peer_timings",
    "run_peer",
    "wire_mean_timings",
]

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
JOIN_WINDOW_S = 0.05  # a tool's start stamp and its request's first packet: µs apart


@dataclass(frozen=True)
class Sent:
    """One request as a tool recorded it: wall-clock times (s) and its own figures (ms)."""

    start_s: float
    first_s: float
    last_s: float
    ttft_ms: float
    itl_ms: float | None  # the tool's per-request mean gap (None: one token)
    output_tokens: int
    input_tokens: int


def guidellm_command(
    exe: str | Path, url: str, model_dir: str | Path, load: BenchLoad, work: Path,
    extra_body: dict[str, Any],
) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """``guidellm run`` (synthetic prompts, its own tokenizer ``model_dir``), writing
    ``work/benchmarks.json``. ``extra_body`` goes in every request (GuideLLM's backend
    ``extras``; it sends ``ignore_eos`` itself when output tokens are set)."""
    backend = [f"kind=openai_http,target={url},model={SERVED_MODEL}"]
    for key, value in extra_body.items():  # its key=value syntax: a list item by item
        items = value if isinstance(value, list) else [value]
        suffix = (lambda i: f"[{i}]") if isinstance(value, list) else (lambda _i: "")
        backend += [f"extras.body.{key}{suffix(i)}={v}" for i, v in enumerate(items)]
    cmd = [
        str(exe), "run", "--backend", ",".join(backend),
        "--data", f"kind=synthetic_text,prompt_tokens={load.input_len},"
                  f"output_tokens={load.output_len}",
        "--profile", f"kind=concurrent,streams={load.concurrency}",
        "--constraint", f"kind=max_requests,count={load.requests}",
        "--tokenizer", f"kind=huggingface_auto,model={model_dir}",
        "--output", f"kind=json,path={work / 'benchmarks.json'}",
        "--disable-console-interactive",
    ]  # fmt: skip
    return cmd, {**os.environ, **OFFLINE}


def guidellm_requests(path: Path) -> dict[str, Sent]:
    """GuideLLM's successful requests from its ``benchmarks.json`` (the first benchmark),
    keyed by its own request ids."""
    bench = json.loads(path.read_text())["benchmarks"][0]
    out = {}
    for r in bench["requests"]["successful"]:
        t = r["info"]["timings"]
        if t.get("first_token_iteration") is None or r.get("time_to_first_token_ms") is None:
            continue
        out[r["request_id"]] = Sent(
            start_s=t["request_start"],
            first_s=t["first_token_iteration"],
            last_s=t["last_token_iteration"],
            ttft_ms=r["time_to_first_token_ms"],
            itl_ms=r.get("inter_token_latency_ms"),
            output_tokens=int(r.get("output_tokens") or 0),
            input_tokens=int(r.get("prompt_tokens") or 0),
        )
    return out


def join_by_time(sent: dict[str, Sent], exchanges: list[Exchange]) -> dict[str, Exchange]:
    """Each tool request's wire exchange, by time: of the answered exchanges with tokens whose
    first request packet is within ``JOIN_WINDOW_S`` of the tool's start, the one nearest in
    start, first token and last token together; pairs taken nearest first, each side once."""
    wire = [ex for ex in answered(exchanges).values() if ex.times()]
    pairs = []
    for rid, s in sent.items():
        for i, ex in enumerate(wire):
            d_start = abs(ex.request_first_ns / 1e9 - s.start_s)
            if d_start > JOIN_WINDOW_S:
                continue
            toks = ex.times()
            cost = d_start + abs(toks[0] / 1e9 - s.first_s) + abs(toks[-1] / 1e9 - s.last_s)
            pairs.append((cost, rid, i))
    joined: dict[str, Exchange] = {}
    used: set[int] = set()
    for _cost, rid, i in sorted(pairs):
        if rid not in joined and i not in used:
            joined[rid] = wire[i]
            used.add(i)
    return joined


def peer_timings(sent: dict[str, Sent]) -> Timings:
    """A tool's own figures, ITL as its one mean gap per request (none for one token)."""
    return Timings(
        {rid: s.ttft_ms for rid, s in sent.items()},
        {rid: [] if s.itl_ms is None else [s.itl_ms] for rid, s in sent.items()},
        {rid: (s.last_s - s.start_s) * 1e3 for rid, s in sent.items()},
    )


def wire_mean_timings(joined: dict[str, Exchange]) -> Timings:
    """The wire's figures of the joined exchanges, keyed by the tool's ids, ITL as the mean
    gap between the token events of each request (as both tools report theirs)."""
    ttft, itl, e2e = {}, {}, {}
    for rid, ex in joined.items():
        toks = ex.times()
        ttft[rid] = (toks[0] - ex.request_last_ns) / NS_PER_MS
        itl[rid] = [(toks[-1] - toks[0]) / NS_PER_MS / (len(toks) - 1)] if len(toks) > 1 else []
        e2e[rid] = (toks[-1] - ex.request_last_ns) / NS_PER_MS
    return Timings(ttft, itl, e2e)


def judge_peer(pcap: Path, port: int, sent: dict[str, Sent]) -> dict[str, Any]:
    """``loadlab._wire.judge.judge``'s answer for a tool's requests against its run's capture,
    joined by the ids it sent when the wire carries them (AIPerf's ``X-Request-ID``), else by
    time, with the tool's own token totals (``input_tokens``, ``output_tokens``)."""
    _, exchanges = read_exchanges(pcap, port)
    by_id = answered(exchanges)
    if sent and all(rid in by_id for rid in sent):  # the tool sent its ids (AIPerf)
        joined = {rid: by_id[rid] for rid in sent if by_id[rid].times()}
    else:
        joined = join_by_time(sent, exchanges)
    fig = judge(peer_timings(sent), wire_mean_timings(joined))
    fig["input_tokens"] = sum(s.input_tokens for s in sent.values())
    fig["output_tokens"] = sum(s.output_tokens for s in sent.values())
    return fig


AIPERF_TOKENIZER = "loadlab/tiny-tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json")


def _as_hf_cache(model_dir: Path, cache: Path) -> Path:
    """The model's tokenizer as the HF cache's copy of ``AIPERF_TOKENIZER``: AIPerf 0.13 with
    HF_HUB_OFFLINE=1 looks every ``--tokenizer`` up in the HF cache, a local folder too."""
    snap = cache / ("models--" + AIPERF_TOKENIZER.replace("/", "--"))
    commit = "0" * 40
    (snap / "refs").mkdir(parents=True, exist_ok=True)
    (snap / "refs" / "main").write_text(commit)
    (snap / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, snap / "snapshots" / commit / name)
    return cache


def aiperf_command(
    exe: str | Path, url: str, model_dir: str | Path, load: BenchLoad, work: Path,
    extra_body: dict[str, Any],
) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """``aiperf profile`` (synthetic prompts, fixed lengths, the model's tokenizer), writing
    ``profile_export.jsonl`` under ``work/artifacts``. ``ignore_eos`` and ``extra_body`` go
    in every request (``--extra-inputs``)."""
    extra = json.dumps({"ignore_eos": True, **extra_body})
    cmd = [
        str(exe), "profile", "--model", SERVED_MODEL, "--url", url, "--endpoint-type", "chat",
        "--streaming", "--tokenizer", AIPERF_TOKENIZER,
        "--concurrency", str(load.concurrency), "--request-count", str(load.requests),
        "--synthetic-input-tokens-mean", str(load.input_len),
        "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(load.output_len),
        "--output-tokens-stddev", "0", "--extra-inputs", extra, "--random-seed", str(load.seed),
        "--artifact-dir", str(work / "artifacts"), "--ui-type", "none",
    ]  # fmt: skip
    cache = _as_hf_cache(Path(model_dir), work / "hf-cache")
    return cmd, {**os.environ, **OFFLINE, "HF_HUB_CACHE": str(cache)}


COMMANDS = {"guidellm": guidellm_command, "aiperf": aiperf_command}
OUTPUTS = {"guidellm": "benchmarks.json", "aiperf": "profile_export.jsonl"}


def run_peer(
    tool: str,
    exe: str | Path,
    url: str,
    model_dir: str | Path,
    load: BenchLoad,
    work: Path,
    extra_body: dict[str, Any],
    timeout_s: float = 900.0,
    cpus: str | None = None,
) -> Path:
    """One run of ``tool`` (``guidellm`` or ``aiperf``; on ``cpus`` only when given), its
    files and log in ``work``; the per-request output file it wrote. Raises RuntimeError
    when it fails."""
    work.mkdir(parents=True, exist_ok=True)
    cmd, env = COMMANDS[tool](exe, url, model_dir, load, work, extra_body)
    log = work / f"{tool}.log"
    with log.open("w") as out:
        proc = subprocess.run(pinned(cmd, cpus), cwd=work, env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=timeout_s)  # fmt: skip
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{tool} exited {proc.returncode} (log {log}):\n{tail}")
    found = sorted(work.rglob(OUTPUTS[tool]))
    if not found:
        raise RuntimeError(f"{tool} wrote no {OUTPUTS[tool]} under {work}")
    return found[0]


def _ms(metrics: dict[str, Any], name: str) -> float | None:
    """One of AIPerf's per-record metrics (its records carry value and unit), times in ms."""
    m = metrics.get(name)
    if m is None:
        return None
    value, unit = (m["value"], m.get("unit")) if isinstance(m, dict) else (m, None)
    return float(value) * {"ns": 1e-6, "us": 1e-3, "s": 1e3, "sec": 1e3}.get(unit or "", 1.0)


def aiperf_requests(path: Path) -> dict[str, Sent]:
    """AIPerf's successful requests from its ``profile_export.jsonl``, keyed by the
    ``X-Request-ID`` it sent (the wire's exchanges carry it too)."""
    out = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        meta, metrics = rec["metadata"], rec.get("metrics", {})
        ttft, latency = _ms(metrics, "time_to_first_token"), _ms(metrics, "request_latency")
        if rec.get("error") or ttft is None or latency is None:
            continue
        start = meta["request_start_ns"] / 1e9
        out[meta["x_request_id"]] = Sent(
            start_s=start,
            first_s=start + ttft / 1e3,
            last_s=start + latency / 1e3,
            ttft_ms=ttft,
            itl_ms=_ms(metrics, "inter_token_latency"),
            output_tokens=int(_ms(metrics, "usage_completion_tokens") or 0),  # server's usage
            input_tokens=int(_ms(metrics, "usage_prompt_tokens") or 0),
        )
    return out
