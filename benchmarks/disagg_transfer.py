"""KV transfer of the disaggregated mode: bytes, seconds and bandwidth per request.

Starts the reference server with ``--mode disaggregated`` (one prefill and one decode worker,
pinned to their own cores) and sends one prompt at a time of each length; each response's
``kv_transfer`` field says how many KV bytes moved from the prefill to the decode worker over
torch.distributed (gloo over loopback TCP on CPU) and how long the receive took::

    python3 benchmarks/disagg_transfer.py                          # cpu preset, 256..2048 tokens
    python3 benchmarks/disagg_transfer.py --preset tiny --lengths 64,256 --repeats 1

Bytes per token must be 2 (K and V) * n_layers * n_kv_heads * head_dim * dtype bytes
(checked on every response; the script exits 1 if not).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from reference_server.launch import start_server
from reference_server.model import PRESETS


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(  # noqa: S310 (loopback URL we started)
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as resp:  # noqa: S310
        return json.loads(resp.read())  # type: ignore[no-any-return]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="cpu")
    p.add_argument("--lengths", default="256,512,1024,2048", help="prompt lengths in tokens")
    p.add_argument("--repeats", type=int, default=3, help="requests per length")
    p.add_argument("--kv-cache-mb", default="256", help="KV cache per worker")
    args = p.parse_args()
    lengths = [int(x) for x in args.lengths.split(",") if x]
    a = PRESETS[args.preset]
    dtype_bytes = 4  # fp32 on CPU
    want = 2 * a.n_layers * a.n_kv_heads * a.head_dim * dtype_bytes
    print(f"preset {args.preset}: 2 * {a.n_layers} layers * {a.n_kv_heads} kv heads * "
          f"{a.head_dim} head_dim * {dtype_bytes} B = {want} KV bytes per token")  # fmt: skip
    extra = ["--kv-cache-mb", args.kv_cache_mb, "--max-model-len", str(max(lengths) + 8)]
    t0 = time.perf_counter()
    with start_server(mode="disaggregated", preset=args.preset, extra_args=extra) as server:
        info = json.loads(urllib.request.urlopen(server.url + "/v1/server_info").read())  # noqa: S310
        print(f"server up in {time.perf_counter() - t0:.1f} s; split {info['compute_split']}; "
              f"backend {info['kv_transfer_backend']}")  # fmt: skip
        url = server.url + "/v1/completions"
        _post(url, {"model": "loadlab-ref", "prompt": "warm up", "max_tokens": 2})
        print(f"{'prompt':>7} {'bytes':>11} {'B/token':>8} {'ms (median)':>12} {'ms (min)':>9} "
              f"{'MB/s (median)':>14}")  # fmt: skip
        ok = True
        for n in lengths:
            secs, nbytes = [], 0
            for i in range(args.repeats):
                prompt = chr(ord("a") + i % 26) * n  # one byte = one token
                body = _post(url, {"model": "loadlab-ref", "prompt": prompt, "max_tokens": 2})
                kv = body["kv_transfer"]
                assert isinstance(kv, dict)
                nbytes = int(kv["bytes"])
                secs.append(float(kv["seconds"]))
                ok &= nbytes == n * want
            med = statistics.median(secs)
            print(f"{n:>7} {nbytes:>11} {nbytes // n:>8} {med * 1e3:>12.2f} "
                  f"{min(secs) * 1e3:>9.2f} {nbytes / med / 1e6:>14.0f}")  # fmt: skip
    print("bytes per token match the formula" if ok else "BYTES PER TOKEN MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
