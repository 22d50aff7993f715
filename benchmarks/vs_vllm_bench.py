"""loadlab beside ``vllm bench serve``, GuideLLM and AIPerf on the same vLLM, each judged by
a packet capture.

    sudo python3 benchmarks/vs_vllm_bench.py [--concurrency 1,8,64] [--requests 200] [--json F]
        [--guidellm PATH|none] [--aiperf PATH|none]

The workload is vllm bench's random dataset, 256 tokens in and 64 out, EOS ignored; loadlab
replays exactly the per-request lengths vLLM counted for it (how, and why both send
``allowed_token_ids``: ``tests/helpers/vllm_bench.py``). At each concurrency, vllm bench runs
and then loadlab, each while ``loadlab._wire`` captures the loopback (root or CAP_NET_RAW):
each tool's TTFT, ITL and E2E are held against the wire's for the same requests (joined by
the ``X-Request-Id`` each tool sends), so the server's speed, which drifts between runs by
more than the tools differ, drops out: each tool is judged against its own run's packets.

GuideLLM and AIPerf run after them at each level, on the same workload as each tool's user
would ask for it (synthetic prompts of ``--input-len`` tokens by the model's tokenizer,
``--output-len`` out, EOS ignored, the same request count, concurrency and
``allowed_token_ids``), each captured too, and are judged on the per-request figures each
writes (GuideLLM's ``benchmarks.json``, AIPerf's ``profile_export.jsonl``): AIPerf's requests
joined to the wire by the ``X-Request-ID`` it sends, GuideLLM's, which carry no id, by time
(``tests/helpers/peers_wire.py``). Both report ITL as one mean gap per request, judged
against the same mean of the wire's token events. ``--guidellm`` and ``--aiperf`` name their
executables; by default the virtualenvs ``scripts/peers/check.sh`` makes, skipped (and said
so) when absent; ``none`` skips one.

Printed per level and tool: the tool's p50 / p90 / p99 minus the wire's, and the per-request
error at p50 / p90 / p99. vllm bench starts TTFT at the first chunk with ``choices`` (vLLM's
role-only first chunk) and counts every such chunk in ITL: ``vllm bench`` is judged against
the wire read its way; ``vllm bench (tokens)`` against the token events loadlab counts, the
definition loadlab uses (``../shared/ARCHITECTURE.md``). Token totals as vllm bench and
loadlab counted them from the server's usage must be equal; GuideLLM's and AIPerf's (their
prompts are their own) are printed beside, and their output totals must be what was asked.

vLLM (``LOADLAB_VLLM_PYTHON``, ``LOADLAB_TINY_MODEL``, as ``scripts/engines/vllm.sh`` sets them;
``--url`` uses one already running, serving the model as ``tiny``) runs on 127.0.0.1 with its
default flags but prefix caching off (``--vllm-args``; both tools send the same prompts). On a
machine of 2 or more cores vLLM is pinned to core 0 and both tools to the others (``--pin``):
vLLM's CPU threads otherwise keep a tool from reading its socket, an error the wire shows and
the tool's own lag monitor flags. ``--json FILE`` writes every figure; the pcap files stay in
the work folder printed at the end. Exit 1 when loadlab's TTFT or ITL is outside its claim at
any level (within 1 ms of the wire at p50 and p90, 2 ms at p99), a total differs, or a
capture dropped packets; the other tools' errors are printed, not judged.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadlab._wire.capture import check_capture
from loadlab._wire.judge import CLAIM_MS
from tests.helpers.peers_wire import (
    aiperf_requests,
    guidellm_requests,
    judge_peer,
    run_peer,
)
from tests.helpers.vllm_bench import BenchLoad, OnWire, run_round, text_token_ids
from tests.helpers.vllm_server import ENV_MODEL, ENV_PYTHON, start_vllm

TOOLS = {
    "loadlab": "loadlab",
    "vllm_bench": "vllm bench",
    "vllm_bench_tokens": "vllm bench (tokens)",
    "guidellm": "GuideLLM",
    "aiperf": "AIPerf",
}
PEERS = {"guidellm": guidellm_requests, "aiperf": aiperf_requests}
VENVS = Path(os.environ.get("LOADLAB_PEERS_VENVS", Path.home() / ".cache" / "loadlab"))
JUDGED = ("ttft", "itl")  # loadlab's claim is checked on these; E2E is printed beside


def pin_split(pin: str) -> tuple[str | None, str | None]:
    """``--pin`` as (server cores, client cores). On a small CPU machine the engine and the
    load generators share the cores: pinned, each tool meets the same server."""
    if pin == "off":
        return None, None
    if pin == "auto":
        n = len(os.sched_getaffinity(0))
        return ("0", f"1-{n - 1}" if n > 2 else "1") if n >= 2 else (None, None)
    server, _, clients = pin.partition(":")
    return server or None, clients or None


def _trio(d: dict[str, float | None]) -> str:
    return " / ".join("-" if d[p] is None else f"{d[p]:+.3f}" for p in ("p50", "p90", "p99"))


def print_level(concurrency: int, figures: dict[str, dict[str, Any]]) -> None:
    print(f"\nconcurrency {concurrency}: each tool minus the wire, ms (p50 / p90 / p99)")
    print(f"  {'tool':22} {'metric':6} {'tool - wire':>26}  {'per-request error':>26}  joined")
    for key, label in TOOLS.items():
        if key not in figures:
            continue
        fig = figures[key]
        for name in ("ttft", "itl", "e2e"):
            m = fig["metrics"][name]
            mark = "" if key != "loadlab" or name not in JUDGED or m["within_claim"] else "  OUT"
            print(
                f"  {label:22} {name.upper():6} {_trio(m['diff_ms']):>26}  "
                f"{_trio(m['error_ms']):>26}  {fig['joined']}/{fig['requests']}{mark}"
            )
    if any(key in figures for key in PEERS):
        print("  (GuideLLM's and AIPerf's ITL: each request's mean gap, as each reports it)")


def peer_executables(
    given: dict[str, str | None], error: Callable[[str], NoReturn]
) -> dict[str, Path]:
    """Each peer's executable: as given, else the virtualenv ``scripts/peers/check.sh`` makes
    when it is there; ``none`` or absent: that peer is skipped, said so. A given one that is
    not there: ``error`` (argparse's: exit 2)."""
    found = {}
    for tool, exe in given.items():
        path = Path(exe) if exe else VENVS / f"{tool}-venv" / "bin" / tool
        if exe == "none":
            print(f"{TOOLS[tool]}: skipped (--{tool} none)")
        elif path.is_file() and os.access(path, os.X_OK):
            found[tool] = path
        elif exe:
            error(f"--{tool} {exe}: no such executable; give the {tool} command or 'none'")
        else:
            print(f"{TOOLS[tool]}: skipped, no {path} (bash scripts/peers/check.sh --help makes "
                  f"it, or give --{tool} PATH)")  # fmt: skip
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--concurrency", default="1,8,64", help="levels, comma-separated")
    p.add_argument("--requests", type=int, default=200, help="requests per tool and level")
    p.add_argument("--rounds", type=int, default=1, help="runs of each level")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--url", help="a vLLM already serving the tiny model as 'tiny'")
    p.add_argument("--python", default=os.environ.get(ENV_PYTHON), help="vLLM's interpreter")
    p.add_argument("--model-dir", default=os.environ.get(ENV_MODEL), help="the tiny model")
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument(
        "--vllm-args",
        default="--no-enable-prefix-caching",
        help="vLLM flags beside the defaults (default: prefix caching off; not with --url)",
    )
    p.add_argument(
        "--pin",
        default="auto",
        help="SERVER:CLIENTS core lists for taskset, e.g. 0:1 (vLLM on core 0, both tools on "
        "core 1); 'auto': 0:1..N-1 on a machine of 2+ cores; 'off': no pinning",
    )
    for tool in PEERS:
        p.add_argument(
            f"--{tool}",
            help=f"the {tool} command (default: {VENVS}/{tool}-venv/bin/{tool} when there; "
            "'none': skip it)",
        )
    args = p.parse_args()
    peers = peer_executables({tool: getattr(args, tool) for tool in PEERS}, p.error)
    if not args.python or not args.model_dir:
        p.error(f"give --python and --model-dir (or set {ENV_PYTHON} and {ENV_MODEL})")
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    check_capture("lo")  # no CAP_NET_RAW: say so before vLLM's minutes of start-up
    server_cpus, client_cpus = pin_split(args.pin)
    extra = {"allowed_token_ids": text_token_ids(args.model_dir)}
    work = Path(tempfile.mkdtemp(prefix="loadlab-vs-vllm-"))
    report: dict[str, Any] = {"pin": [server_cpus, client_cpus], "claims_ms": CLAIM_MS}
    runs: list[dict[str, Any]] = []
    ok = True
    with ExitStack() as stack:
        url = args.url
        if url is None:
            server = stack.enter_context(
                start_vllm(args.python, args.model_dir, timeout_s=600,
                           extra_args=shlex.split(args.vllm_args), cpus=server_cpus)
            )  # fmt: skip
            url = server.url
        for i in range(args.rounds):
            for c in levels:
                load = BenchLoad(args.requests, c, args.input_len, args.output_len, args.seed)
                tag = f"-c{c}-{i}"
                wire = OnWire(url, work, tag)
                round_ = run_round(args.python, url, args.model_dir, load, work, extra, tag,
                                   cpus=client_cpus, around=wire)  # fmt: skip
                peer_figures = {}
                for tool, exe in peers.items():
                    with wire(tool):
                        out = run_peer(tool, exe, url, args.model_dir, load,
                                       work / f"{tool}{tag}", extra, cpus=client_cpus)  # fmt: skip
                    sent = PEERS[tool](out)
                    peer_figures[tool] = judge_peer(wire.caps[tool].pcap, wire.port, sent)
                rnd = wire.judge(*round_)
                rnd.figures.update(peer_figures)
                print_level(c, rnd.figures)
                totals = {
                    "vllm_bench": [
                        rnd.bench["total_input_tokens"],
                        rnd.bench["total_output_tokens"],
                    ],
                    "loadlab": [
                        sum(r.prompt_tokens or 0 for r in rnd.results.records),
                        sum(r.output_tokens or 0 for r in rnd.results.records),
                    ],
                }
                for tool, fig in peer_figures.items():
                    totals[tool] = [fig["input_tokens"], fig["output_tokens"]]
                    asked = load.requests * load.output_len
                    if fig["output_tokens"] != asked:
                        ok = False
                        print(f"  {TOOLS[tool]}: {fig['output_tokens']} tokens out, not {asked}")
                same = totals["vllm_bench"] == totals["loadlab"]
                judged = all(rnd.figures["loadlab"]["metrics"][m]["within_claim"] for m in JUDGED)
                ok &= same and judged and rnd.dropped == 0
                print(
                    f"  token totals in / out: vllm bench {totals['vllm_bench']}, loadlab "
                    f"{totals['loadlab']} ({'equal' if same else 'DIFFER'})"
                    + "".join(f", {TOOLS[t]} {totals[t]}" for t in peer_figures)
                    + "; capture drops "
                    f"{rnd.dropped}; loadlab saturated: {rnd.results.saturated}",
                    flush=True,
                )
                runs.append(
                    {"concurrency": c, "round": i, "figures": rnd.figures, "totals": totals,
                     "dropped": rnd.dropped, "loadlab_saturated": rnd.results.saturated}
                )  # fmt: skip
    claim = ", ".join(f"{v:g} ms at p{p}" for p, v in CLAIM_MS.items())
    print(f"\npinning: vLLM on cores {server_cpus or 'any'}, both tools on {client_cpus or 'any'}")
    print(f"claim: loadlab's TTFT and ITL within {claim} of the wire")
    print(f"load average after: {Path('/proc/loadavg').read_text().strip()}")
    print(f"captures and each tool's files: {work}")
    print("PASS" if ok else "FAIL")
    if args.json:
        report.update(runs=runs, passed=ok)
        args.json.write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
