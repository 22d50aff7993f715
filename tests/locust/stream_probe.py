"""Runs ``StreamConnection`` (the Locust user's transport) under gevent in its own process, one
request per fault mode, and prints one JSON object: mode -> what the record says.

    python3 -m tests.locust.stream_probe http://127.0.0.1:PORT REFUSED_URL   # fault server
    python3 -m tests.locust.stream_probe --reuse https://127.0.0.1:PORT      # two requests
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

from loadlab.config import EndpointConfig  # noqa: E402
from loadlab.locust._stream import StreamConnection  # noqa: E402
from loadlab.records import RequestSpec  # noqa: E402
from tests.helpers.fault_server import MODES  # noqa: E402


def one(conn: StreamConnection, rid: str) -> dict[str, object]:
    rec = conn.send(RequestSpec(rid, "hi", 3), t0_ns=time.perf_counter_ns(), timeout_s=2.0).record
    return {
        "outcome": rec.outcome,
        "chunks": len(rec.chunk_ns),
        "timed": rec.sent_ns is not None and rec.end_ns is not None,
        "error": rec.error,
        "retry_after_s": rec.server.get("retry_after_s"),
        "tokens": rec.output_tokens,
    }


def main(url: str) -> None:
    out: dict[str, object] = {}

    def mode(m: str) -> None:
        conn = StreamConnection(EndpointConfig(f"{url}/fault/{m}"), read_timeout_s=1.0)
        out[m] = one(conn, f"p-{m}")
        conn.close()

    gevent.joinall([gevent.spawn(mode, m) for m in MODES if m != "echo_auth"])
    keep = StreamConnection(EndpointConfig(f"{url}/fault/ok"), read_timeout_s=1.0)
    first = one(keep, "k1")
    sock = keep._sock
    second = one(keep, "k2")
    out["keep_alive"] = {"both_ok": first["outcome"] == second["outcome"] == "ok",
                         "same_socket": sock is not None and keep._sock is sock}  # fmt: skip
    refused = StreamConnection(EndpointConfig(sys.argv[2]), read_timeout_s=1.0)
    out["refused"] = one(refused, "r1")
    print(json.dumps(out))


def reuse(url: str) -> None:
    """Two requests on one connection (e.g. over TLS): their outcomes and the socket kept."""
    conn = StreamConnection(EndpointConfig(url), read_timeout_s=5)
    first = one(conn, "t1")
    sock = conn._sock
    second = one(conn, "t2")
    print(json.dumps({"records": [first, second], "same_socket": sock is conn._sock}))


if __name__ == "__main__":
    if sys.argv[1] == "--reuse":
        reuse(sys.argv[2])
    else:
        main(sys.argv[1])
