"""How exact is loadlab's Locust user? Its TTFT and token times against a server's own truth.

Two parts, both against the fixed-schedule server (``python -m loadlab.selftest``: TTFT
100 ms, one token every 20 ms, each write time logged with ``perf_counter_ns``, which is
``CLOCK_MONOTONIC`` and so comparable with the client's times on one machine):

1. ``--clients``: the HTTP clients a Locust user could stream with, under gevent, 50 users,
   no Locust runner (the raw cost of each way of reading): loadlab's ``StreamConnection`` (what
   ``LLMUser`` uses: a gevent socket and loadlab's HTTP reader), geventhttpclient ``readline``,
   Locust's ``FastHttpSession.iter_lines`` (reads 1 KiB blocks: what
   ``FastHttpUser`` streaming gives) and requests/urllib3 ``iter_lines``.
2. ``locust -f tests/locust/locustfile_fixed.py --headless`` in one process (one worker's
   worth) at rising user counts: TTFT p99 from loadlab's records vs the server's truth, the
   delay from each token's write to its read (p50 / p99), and the CPU the process used.

    python3 benchmarks/locust_timing.py                       # both parts, ~3 minutes
    python3 benchmarks/locust_timing.py --users 50 --duration 20 --no-clients
    python3 benchmarks/locust_timing.py --users 50,100,200,400,800 --tokens 50

Error definitions: "TTFT p99 error" = p99 of loadlab's TTFT minus p99 of the server's
(first write - request arrival); "paired p99" = p99 over requests of (loadlab TTFT - server
TTFT); "send" = p99 of (server's request arrival - loadlab's send stamp); "1st lag" = p99 of
the first token's read time - its write time; "read lag" = the same for every token.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadlab._analysis.metrics import percentile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LOCUSTFILE = ROOT / "tests" / "locust" / "locustfile_fixed.py"


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 (loopback only)
        return json.loads(r.read())


def reset(url: str) -> None:
    req = urllib.request.Request(url + "/truth/reset", data=b"", method="POST")  # noqa: S310
    with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310
        r.read()


def pct(values: list[float], q: float) -> float:
    v = percentile(values, q)  # loadlab's one percentile, so the figures compare
    return float("nan") if v is None else v


# ---------------------------------------------------------------- part 1: raw clients


def client_probe(mode: str, url: str, users: int, duration_s: float, tokens: int) -> None:
    """Runs in its own process (gevent patches the interpreter); prints one JSON line."""
    from gevent import monkey

    monkey.patch_all()
    import itertools

    import gevent
    import requests
    from geventhttpclient import HTTPClient
    from locust.contrib.fasthttp import FastHttpSession
    from locust.env import Environment

    body = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": tokens,
            "stream": True,
        }
    ).encode()
    ids = itertools.count()
    reads: dict[str, tuple[int, list[int]]] = {}
    path = "/v1/chat/completions"
    gh = HTTPClient.from_url(url, concurrency=users + 5, network_timeout=30)
    sess = requests.Session()
    sess.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=users + 5))
    fast = FastHttpSession(url, Environment().events.request, None, concurrency=users + 5)

    def token(line: bytes) -> bool:
        return b'"content":"' in line and b'"content":""' not in line

    from loadlab.config import EndpointConfig
    from loadlab.locust._stream import StreamConnection
    from loadlab.records import RequestSpec

    ep = EndpointConfig(url, model="m")
    conns: dict[str, StreamConnection] = {}

    def one(rid: str) -> None:
        hdr = {"X-Request-Id": rid, "Content-Type": "application/json"}
        ts: list[int] = []
        sent = time.perf_counter_ns()
        if mode == "loadlab-stream":  # what LLMUser uses
            user = rid.rsplit("-", 1)[0]
            conn = conns.get(user) or conns.setdefault(user, StreamConnection(ep))
            t0 = time.perf_counter_ns()
            rec = conn.send(RequestSpec(rid, "hi", tokens), t0_ns=t0).record
            sent = t0 + (rec.sent_ns or 0)
            ts = [t0 + c for c in rec.chunk_ns]
        elif mode == "geventhttpclient-readline":
            r = gh.request("POST", path, body=body, headers=hdr)
            while line := r.readline(b"\n"):
                t = time.perf_counter_ns()
                if token(line):
                    ts.append(t)
            r.release()
        elif mode == "requests-iter_lines":
            with sess.post(url + path, data=body, headers=hdr, stream=True) as r:
                for line in r.iter_lines():
                    t = time.perf_counter_ns()
                    if token(line):
                        ts.append(t)
        elif mode == "fasthttp-iter_lines":
            for text in fast.iter_lines(path, method="POST", data=body, headers=hdr):
                t = time.perf_counter_ns()
                if token(text.encode()):
                    ts.append(t)
        reads[rid] = (sent, ts)

    stop = time.perf_counter() + duration_s

    def user(u: int) -> None:
        gevent.sleep(u * 0.02)
        while time.perf_counter() < stop:
            one(f"{mode}-{u}-{next(ids)}")

    cpu0 = time.process_time()
    gevent.joinall([gevent.spawn(user, u) for u in range(users)])
    cpu_s = time.process_time() - cpu0
    print(json.dumps({"reads": reads, "cpu_s": cpu_s}))


def compare_clients(url: str, users: int, duration_s: float, tokens: int) -> None:
    print(
        f"\n== raw clients under gevent: {users} users, {tokens} tokens/request, "
        f"{duration_s:g} s each"
    )
    print(
        f"{'client':28s} {'reqs':>5s} {'TTFT p50/p99 (truth)':>26s} {'p99 err':>8s} "
        f"{'read lag p50/p99':>17s} {'CPU/token':>10s}"
    )
    modes = (
        "loadlab-stream",
        "geventhttpclient-readline",
        "fasthttp-iter_lines",
        "requests-iter_lines",
    )
    for mode in modes:
        reset(url)
        cmd = [
            sys.executable,
            __file__,
            "--probe",
            mode,
            "--url",
            url,
            "--probe-users",
            str(users),
            "--duration",
            str(duration_s),
            "--tokens",
            str(tokens),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 120)
        if out.returncode != 0:
            print(f"{mode:28s} failed: {out.stderr[-500:]}")
            continue
        data = json.loads(out.stdout.strip().splitlines()[-1])
        truth = get_json(url + "/truth")
        row(mode, data["reads"], truth, data["cpu_s"])


def row(label: str, reads: dict[str, Any], truth: dict[str, Any], cpu_s: float) -> None:
    c_ttft, s_ttft, lag = [], [], []
    for rid, (sent, ts) in reads.items():
        tr = truth.get(rid)
        if not tr or len(ts) != len(tr["chunk_ns"]) or not ts:
            continue
        c_ttft.append((ts[0] - sent) / 1e6)
        s_ttft.append((tr["chunk_ns"][0] - tr["recv_ns"]) / 1e6)
        lag += [(a - b) / 1e6 for a, b in zip(ts, tr["chunk_ns"], strict=True)]
    n_tok = max(1, len(lag))
    print(
        f"{label:28s} {len(c_ttft):5d} {pct(c_ttft, 50):8.1f}/{pct(c_ttft, 99):6.1f} "
        f"({pct(s_ttft, 50):5.1f}/{pct(s_ttft, 99):5.1f}) {pct(c_ttft, 99) - pct(s_ttft, 99):8.2f} "
        f"{pct(lag, 50):8.2f}/{pct(lag, 99):7.2f} {cpu_s / n_tok * 1e6:7.0f} µs"
    )


# ---------------------------------------------------------------- part 2: LLMUser in Locust


def run_locust(
    url: str,
    locustfile: Path,
    users: int,
    spawn_rate: float,
    duration_s: float,
    extra: Sequence[str] = (),
    *,
    tree: Path = ROOT,
    slack_s: float = 120,
) -> dict[str, Any]:
    """One headless Locust process running ``locustfile`` (``extra``: its own options) with
    ``tree``'s loadlab; the results file loadlab's hooks wrote (``--loadlab-out``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless",
               "-u", str(users), "-r", str(spawn_rate), "-t", f"{int(duration_s)}s", "--host", url,
               "--loadlab-out", str(out), "--only-summary", *extra]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(tree)}
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env,
                              timeout=duration_s + slack_s, check=False)  # fmt: skip
        if not out.exists():
            raise RuntimeError(
                f"locust wrote no results:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        return dict(json.loads(out.read_text()))


def locust_level(url: str, users: int, duration_s: float, tokens: int) -> dict[str, Any]:
    reset(url)
    opts = ["--turns", "1", "--max-tokens", str(tokens), "--itl-rows", "gaps"]
    res = run_locust(url, LOCUSTFILE, users, max(users, 1), duration_s, opts)
    truth = get_json(url + "/truth")
    t0 = res["extra"]["locust"]["t0_perf_ns"]
    c_ttft, s_ttft, paired, lag, send, first = [], [], [], [], [], []
    for r in res["records"]:
        tr = truth.get(r["request_id"])
        if r["outcome"] != "ok" or not tr or len(tr["chunk_ns"]) != len(r["chunk_ns"]):
            continue
        c = (r["chunk_ns"][0] - r["sent_ns"]) / 1e6
        s = (tr["chunk_ns"][0] - tr["recv_ns"]) / 1e6
        c_ttft.append(c)
        s_ttft.append(s)
        paired.append(c - s)
        send.append((tr["recv_ns"] - r["sent_ns"] - t0) / 1e6)
        first.append((r["chunk_ns"][0] + t0 - tr["chunk_ns"][0]) / 1e6)
        lag += [(a + t0 - b) / 1e6 for a, b in zip(r["chunk_ns"], tr["chunk_ns"], strict=True)]
    return {
        "users": users,
        "requests": len(c_ttft),
        "tokens_per_s": len(lag) / duration_s,
        "ttft_p99_ms": pct(c_ttft, 99),
        "truth_ttft_p99_ms": pct(s_ttft, 99),
        "ttft_p99_error_ms": pct(c_ttft, 99) - pct(s_ttft, 99),
        "paired_p99_ms": pct(paired, 99),
        "send_p99_ms": pct(send, 99),
        "first_lag_p99_ms": pct(first, 99),
        "lag_p50_ms": pct(lag, 50),
        "lag_p99_ms": pct(lag, 99),
        "cpu_percent": res["generator"].get("cpu_percent_mean", float("nan")),
        "cpu_us_per_token": res["generator"].get("cpu_percent_mean", float("nan"))
        / 100
        * duration_s
        / max(1, len(lag))
        * 1e6,
        "saturated": res["generator"].get("saturated"),
        "loop_lag_p99_ms": res["generator"].get("loop_lag_ms_p99"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--users", default="50,100,200,400", help="user counts for part 2")
    p.add_argument("--duration", type=float, default=15.0, help="seconds per level")
    p.add_argument("--tokens", type=int, default=50, help="tokens per request")
    p.add_argument("--no-clients", action="store_true", help="skip part 1")
    p.add_argument("--probe", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--probe-users", type=int, default=50, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.probe:
        client_probe(args.probe, args.url, args.probe_users, args.duration, args.tokens)
        return 0
    from loadlab.selftest import FixedServerProcess

    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    with FixedServerProcess(ttft_ms=100, itl_ms=20) as url:
        if not args.no_clients:
            compare_clients(url, 50, args.duration, args.tokens)
        print(
            f"\n== LLMUser in one Locust process, {args.tokens} tokens/request, "
            f"{args.duration:g} s per level (TTFT 100 ms, ITL 20 ms)"
        )
        print(
            f"{'users':>5s} {'reqs':>5s} {'tok/s':>6s} {'TTFT p99':>8s} {'truth':>6s} "
            f"{'err':>6s} {'paired':>7s} {'send':>6s} {'1st lag':>7s} {'lag p50/p99':>13s} {'CPU %':>6s} {'µs/tok':>6s} "
            f"{'loop p99':>8s}"
        )
        for users in [int(u) for u in args.users.split(",")]:
            m = locust_level(url, users, args.duration, args.tokens)
            print(
                f"{m['users']:5d} {m['requests']:5d} {m['tokens_per_s']:6.0f} "
                f"{m['ttft_p99_ms']:8.1f} {m['truth_ttft_p99_ms']:6.1f} "
                f"{m['ttft_p99_error_ms']:6.2f} {m['paired_p99_ms']:7.2f} "
                f"{m['send_p99_ms']:6.2f} {m['first_lag_p99_ms']:7.2f} "
                f"{m['lag_p50_ms']:6.2f}/{m['lag_p99_ms']:6.2f} {m['cpu_percent']:6.0f} "
                f"{m['cpu_us_per_token']:6.0f} "
                f"{m['loop_lag_p99_ms']:8.1f}{'  SATURATED' if m['saturated'] else ''}",
                flush=True,
            )
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end (the machine is shared)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
