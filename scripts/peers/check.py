"""The clients users already have, run against ``loadlab-server``: ``vllm bench serve``,
GuideLLM and AIPerf, each as its user would run it, and loadlab itself on the same workload.

    bash scripts/peers/check.sh                       # makes the tools' virtualenvs, runs this
    python3 scripts/peers/check.py --guidellm BIN --aiperf BIN --vllm-python PY [--json FILE]

One reference server (``--preset tiny``, 127.0.0.1, a free port) serves every run. The tools
build their prompts with the server's own tokenizer, exported as a Hugging Face tokenizer folder
(``python3 -m reference_server.tokenizer DIR``: one token per UTF-8 byte, the server's chat
formatting as its chat template), so that a prompt of N tokens by the tool's count is N tokens
by the server's; ``HF_HUB_OFFLINE=1``: nothing is downloaded. The workload is synthetic: fixed
prompt and output lengths (``--input-len``, ``--output-len``), streaming chat, each
``--concurrency`` level in turn, ``--requests`` requests a level.

For each tool and level: did it finish, were all its requests ok, and do its input and output
token totals equal what the server counted for that run (``/metrics`` before and after: input
is ``loadlab_server_prefix_cache_queries_total``, the prompt tokens of admitted requests; output
is ``tokens_total{phase="decode"}`` plus one per finished request, whose first token comes out
of its prefill step) and what was asked (requests x lengths)? A tool that is not given is
skipped. Prints a table; ``--json FILE`` keeps every figure. Exit 1 when a check fails.
Not in CI (about 5 minutes on the 2-core VM, once the virtualenvs exist).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from loadlab._runner.scrape import parse_prometheus_text  # noqa: E402
from loadlab.results import read_results  # noqa: E402 - after the path
from reference_server.tokenizer import write_hf_tokenizer  # noqa: E402

MODEL = "loadlab-ref"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
M = "loadlab_server_"


@dataclass(frozen=True)
class Load:
    concurrency: int
    requests: int
    input_len: int
    output_len: int


@dataclass
class Outcome:
    """One tool's run at one level: its own figures beside the server's."""

    tool: str
    concurrency: int
    ok: bool = False
    wall_s: float = 0.0
    completed: int | None = None  # as the tool reports
    failed: int | None = None
    input_tokens: int | None = None  # totals, as the tool reports
    output_tokens: int | None = None
    ttft_p50_ms: float | None = None
    itl_p50_ms: float | None = None
    server: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    command: str = ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - our loopback server
        return str(r.read().decode())


def server_counts(url: str) -> dict[str, int]:
    """The server's request and token counters (see the module doc)."""
    m = parse_prometheus_text(_get(url + "/metrics"))
    finished = sum(int(v) for k, v in m.items() if k.startswith(M + "requests_total{"))
    decode = int(m.get(M + 'tokens_total{phase="decode"}', 0))
    return {
        "requests": finished,
        "ok_requests": sum(
            int(m.get(M + f'requests_total{{finish_reason="{r}"}}', 0)) for r in ("length", "stop")
        ),
        "input_tokens": int(m.get(M + "prefix_cache_queries_total", 0)),
        "output_tokens": decode + finished,
    }


def start_server(preset: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "reference_server.cli", "--preset", preset, "--mode",
           "continuous", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)  # noqa: S603
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"loadlab-server exited {proc.returncode}: {log.read_text()[-2000:]}"
            )
        try:
            _get(url + "/health")
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("loadlab-server did not answer /health within 120 s")


def _run(cmd: list[str], log: Path, env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    with log.open("w") as out:
        out.write(" ".join(cmd) + "\n")
        out.flush()
        try:
            proc = subprocess.run(cmd, cwd=log.parent, env=env, stdout=out,  # noqa: S603
                                  stderr=subprocess.STDOUT, timeout=timeout_s)  # fmt: skip
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, log.read_text(errors="replace")


# ---------------------------------------------------------------- each tool


def run_loadlab(url: str, load: Load, work: Path, _tok: Path) -> Outcome:
    out = work / "loadlab.json"
    cmd = [sys.executable, "-m", "loadlab", "run", "--endpoint", url, "--model", MODEL,
           "--api", "chat", "--concurrency", str(load.concurrency), "--requests",
           str(load.requests), "--prompt-tokens", str(load.input_len), "--max-tokens",
           str(load.output_len), "--exact-output", "--out", str(out), "--no-progress"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rc, text = _run(cmd, work / "loadlab.log", env, 600)
    o = Outcome("loadlab", load.concurrency, command=" ".join(cmd[1:]))
    if rc != 0 or not out.is_file():
        o.problems.append(f"exit {rc}: {text[-500:]}")
        return o
    res = read_results(out)
    summary = res.to_dict()["summary"]
    o.completed = sum(r.ok for r in res.records)
    o.failed = sum(not r.ok for r in res.records)
    o.input_tokens = sum(r.prompt_tokens or 0 for r in res.records)
    o.output_tokens = sum(r.output_tokens or 0 for r in res.records)
    o.ttft_p50_ms = summary["ttft_ms"]["p50"]
    o.itl_p50_ms = summary["itl_ms"]["p50"]
    o.ok = True
    return o


def run_vllm_bench(python: str, url: str, load: Load, work: Path, tok: Path) -> Outcome:
    out = work / "vllm.json"
    cmd = [python, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
           "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", url,
           "--model", MODEL, "--tokenizer", str(tok), "--dataset-name", "random",
           "--random-input-len", str(load.input_len), "--random-output-len",
           str(load.output_len), "--num-prompts", str(load.requests), "--max-concurrency",
           str(load.concurrency), "--ignore-eos", "--disable-tqdm", "--save-result",
           "--result-dir", str(work), "--result-filename", out.name]  # fmt: skip
    env = {**os.environ, **OFFLINE, "VLLM_TARGET_DEVICE": "cpu"}
    rc, text = _run(cmd, work / "vllm.log", env, 600)
    o = Outcome("vllm bench serve", load.concurrency, command=" ".join(cmd[3:]))
    if rc != 0 or not out.is_file():
        o.problems.append(f"exit {rc}: {text[-800:]}")
        return o
    data = json.loads(out.read_text())
    o.completed, o.failed = data["completed"], data.get("failed", 0)
    o.input_tokens, o.output_tokens = data["total_input_tokens"], data["total_output_tokens"]
    o.ttft_p50_ms, o.itl_p50_ms = data["median_ttft_ms"], data["median_itl_ms"]
    o.ok = True
    return o


def run_guidellm(guidellm: str, url: str, load: Load, work: Path, tok: Path) -> Outcome:
    out = work / "guidellm.json"
    cmd = [guidellm, "run",
           "--backend", f"kind=openai_http,target={url},model={MODEL}",
           "--data", f"kind=synthetic_text,prompt_tokens={load.input_len},"
                     f"output_tokens={load.output_len}",
           "--profile", f"kind=concurrent,streams={load.concurrency}",
           "--constraint", f"kind=max_requests,count={load.requests}",
           "--tokenizer", f"kind=huggingface_auto,model={tok}",
           "--output", f"kind=json,path={out}", "--disable-console-interactive"]  # fmt: skip
    rc, text = _run(cmd, work / "guidellm.log", {**os.environ, **OFFLINE}, 600)
    o = Outcome("GuideLLM", load.concurrency, command=" ".join(cmd[1:]))
    if rc != 0 or not out.is_file():
        o.problems.append(f"exit {rc}: {text[-800:]}")
        return o
    bench = json.loads(out.read_text())["benchmarks"][0]
    metrics = bench["metrics"]
    totals = metrics["request_totals"]
    o.completed, o.failed = totals["successful"], totals["errored"] + totals.get("incomplete", 0)
    o.input_tokens = int(metrics["prompt_token_count"]["successful"]["total_sum"])
    o.output_tokens = int(metrics["output_token_count"]["successful"]["total_sum"])
    o.ttft_p50_ms = metrics["time_to_first_token_ms"]["successful"]["median"]
    o.itl_p50_ms = metrics["inter_token_latency_ms"]["successful"]["median"]
    o.ok = True
    return o


def run_aiperf(aiperf: str, url: str, load: Load, work: Path, tok: Path) -> Outcome:
    art = work / "artifacts"
    cmd = [aiperf, "profile", "--model", MODEL, "--url", url, "--endpoint-type", "chat",
           "--streaming", "--tokenizer", AIPERF_TOKENIZER, "--concurrency", str(load.concurrency),
           "--request-count", str(load.requests),
           "--synthetic-input-tokens-mean", str(load.input_len),
           "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(load.output_len),
           "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
           "--artifact-dir", str(art), "--ui-type", "none"]  # fmt: skip
    env = {**os.environ, **OFFLINE, "HF_HUB_CACHE": str(_as_hf_cache(tok, work / "hf-cache"))}
    rc, text = _run(cmd, work / "aiperf.log", env, 600)
    o = Outcome("AIPerf", load.concurrency, command=" ".join(cmd[1:]))
    found = sorted(art.rglob("profile_export_aiperf.json"))
    if rc != 0 or not found:
        o.problems.append(f"exit {rc}: {text[-800:]}")
        return o
    data = json.loads(found[0].read_text())
    records = [json.loads(line) for p in art.rglob("profile_export.jsonl")
               for line in p.read_text().splitlines() if line.strip()]  # fmt: skip
    o.completed = int(data["request_count"]["avg"])
    o.failed = int(data.get("error_request_count", {}).get("avg", 0))
    o.input_tokens = sum(int(_metric(r, "input_sequence_length")) for r in records)
    o.output_tokens = sum(int(_metric(r, "output_sequence_length")) for r in records)
    o.ttft_p50_ms = data["time_to_first_token"]["p50"]
    o.itl_p50_ms = data["inter_token_latency"]["p50"]
    o.ok = True
    return o


AIPERF_TOKENIZER = "loadlab/byte-tokenizer"


def _as_hf_cache(tok: Path, cache: Path) -> Path:
    """``tok`` as the HF cache's copy of ``AIPERF_TOKENIZER``. AIPerf 0.13 with HF_HUB_OFFLINE=1
    looks every ``--tokenizer`` up in the HF cache, a local folder too (HFValidationError: "Repo
    id must be in the form 'repo_name' or 'namespace/repo_name'"); a cached model id loads."""
    snap = cache / ("models--" + AIPERF_TOKENIZER.replace("/", "--"))
    commit = "0" * 40
    (snap / "refs").mkdir(parents=True, exist_ok=True)
    (snap / "refs" / "main").write_text(commit)
    shutil.copytree(tok, snap / "snapshots" / commit, dirs_exist_ok=True)
    return cache


def _metric(record: dict[str, Any], name: str) -> float:
    value = record["metrics"][name]
    return float(value["value"] if isinstance(value, dict) else value)


Runner = Callable[[str, Load, Path, Path], Outcome]


def check(o: Outcome, load: Load) -> None:
    """Append what disagrees to ``o.problems``."""
    if not o.ok:
        return
    s = o.server
    want = {"completed": load.requests, "failed": 0}
    for name, value in want.items():
        if getattr(o, name) != value:
            o.problems.append(f"{name} {getattr(o, name)}, expected {value}")
    if s.get("ok_requests") != load.requests:
        o.problems.append(f"the server finished {s.get('ok_requests')} ok, not {load.requests}")
    for kind, per in (("input_tokens", load.input_len), ("output_tokens", load.output_len)):
        mine, server = getattr(o, kind), s.get(kind)
        if mine != server:
            o.problems.append(f"{kind}: the tool says {mine}, the server counted {server}")
        asked = per * load.requests
        # vllm bench's random prompts are random token ids decoded and re-encoded: on a byte
        # tokenizer a cut can fall inside a UTF-8 character (U+FFFD, 3 bytes), so they drift
        slack = asked // 100 if o.tool == "vllm bench serve" and kind == "input_tokens" else 0
        if server is None or abs(server - asked) > slack:
            o.problems.append(f"{kind}: the server counted {server}, asked {asked}")


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--concurrency", default="1,4,8", help="levels, comma-separated")
    p.add_argument("--requests", type=int, default=32, help="requests a level")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--preset", default="tiny", help="the reference server's model")
    p.add_argument("--vllm-python", help="an interpreter with vLLM (vllm bench serve)")
    p.add_argument("--guidellm", help="the guidellm command")
    p.add_argument("--aiperf", help="the aiperf command")
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args()
    tools: dict[str, Runner] = {"loadlab": run_loadlab}
    if args.vllm_python:
        tools["vllm"] = lambda *a: run_vllm_bench(args.vllm_python, *a)
    if args.guidellm:
        tools["guidellm"] = lambda *a: run_guidellm(args.guidellm, *a)
    if args.aiperf:
        tools["aiperf"] = lambda *a: run_aiperf(args.aiperf, *a)
    levels = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="loadlab-peers-"))
    tok = write_hf_tokenizer(work / "byte-tokenizer")
    print(f"work folder {work}; load average {os.getloadavg()}", flush=True)
    proc, url = start_server(args.preset, work / "server.log")
    outcomes: list[Outcome] = []
    try:
        for name, runner in tools.items():
            for c in levels:
                load = Load(c, args.requests, args.input_len, args.output_len)
                run_dir = work / f"{name}-c{c}"
                run_dir.mkdir()
                before = server_counts(url)
                t0 = time.monotonic()
                o = runner(url, load, run_dir, tok)
                o.wall_s = round(time.monotonic() - t0, 1)
                after = server_counts(url)
                o.server = {k: after[k] - before[k] for k in after}
                check(o, load)
                outcomes.append(o)
                print(_row(o), flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2))
    bad = [o for o in outcomes if o.problems or not o.ok]
    print(f"{len(outcomes) - len(bad)} passed, {len(bad)} failed; load average {os.getloadavg()}")
    return 1 if bad else 0


def _row(o: Outcome) -> str:
    s = o.server
    head = (f"{o.tool:18} c={o.concurrency:<2} {'ok ' if o.ok and not o.problems else 'BAD'} "
            f"{o.wall_s:6.1f}s  done {o.completed}/{(o.completed or 0) + (o.failed or 0)}  "
            f"in {o.input_tokens} (server {s.get('input_tokens')})  "
            f"out {o.output_tokens} (server {s.get('output_tokens')})  "
            f"ttft p50 {_ms(o.ttft_p50_ms)}  itl p50 {_ms(o.itl_p50_ms)}")  # fmt: skip
    return "\n".join([head, *(f"    ! {p}" for p in o.problems)])


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} ms"


if __name__ == "__main__":
    sys.exit(main())
