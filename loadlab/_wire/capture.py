"""Packet capture with the kernel's timestamps, in a process of its own.

A Linux packet socket (``AF_PACKET``, ``SOCK_DGRAM``: the IP packet without its link header)
with ``SO_TIMESTAMPNS`` hands over every packet with the time the kernel saw it
(``CLOCK_REALTIME``, nanoseconds). A classic BPF program attached to the socket keeps only
TCP to or from the endpoint's port that carries data (or opens or closes a connection), and
of each packet the one copy the client's interface sees: the client's packets as they leave
(``PACKET_OUTGOING``), the server's as they arrive (``PACKET_HOST``). The loopback shows every
packet both ways; a real interface shows each once.

The capture runs as ``python -m loadlab._wire.capture`` (``Capture`` starts it), at a lower
CPU priority, so the sender never waits for it: the kernel stamps and queues each packet (a
64 MiB queue; the capture only has to empty it before it fills), and the child writes them
to a pcap file (nanosecond timestamps, ``LINKTYPE_RAW``: Wireshark and tcpdump read it),
readable by its owner only: it holds every byte, API keys and prompts included. It stops when its
stdin closes, after reading what is queued, and prints its counts: packets, and packets the
kernel dropped (a full queue), which the analysis reports.

Opening a packet socket needs root or ``CAP_NET_RAW``; ``check_capture`` says so before a run.

``Capture`` also samples the offset between the packets' clock and loadlab's at its start and
its end (``loadlab._wire.clock``).

Example::

    with Capture(port=8000) as cap:       # before the load: the child is bound and filtering
        ...                               # the load
    cap.result.pcap, cap.result.dropped, cap.clock.to_perf_ns(t_real)
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from loadlab._wire.clock import ClockMap, clock_offset_ns
from loadlab.errors import ConfigError

__all__ = ["Capture", "CaptureResult", "capture_filter", "check_capture", "main"]

ETH_P_ALL = 0x0003
_ALL = socket.htons(ETH_P_ALL)
SO_TIMESTAMPNS = 35  # asm-generic (x86-64, arm64); Python's socket module does not name it
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_HOST, PACKET_OUTGOING = 0, 4
RCVBUF_BYTES = 64 << 20  # the kernel's queue for packets the child has not read yet
SNAP_BYTES = 256 << 10  # a loopback packet is at most 64 KiB (plus GSO headroom)
PCAP_MAGIC_NS = 0xA1B23C4D
LINKTYPE_RAW = 101
NEEDS = (
    "the wire capture needs root or CAP_NET_RAW (a packet socket); run as root, or give the "
    'interpreter the capability: sudo setcap cap_net_raw+ep "$(readlink -f {python})"'
)

# ------------------------------------------------------------------ the filter (classic BPF)

_LD_B_ABS, _LD_H_ABS, _LD_W_ABS, _LD_H_IND, _LD_B_IND = 0x30, 0x28, 0x20, 0x48, 0x50
_LD_MEM, _LDX_MEM, _ST, _STX, _TAX = 0x60, 0x61, 0x02, 0x03, 0x07
_LDX_B_MSH, _LDX_IMM = 0xB1, 0x01
_ALU_AND_K, _ALU_ADD_K, _ALU_ADD_X, _ALU_RSH_K = 0x54, 0x04, 0x0C, 0x74
_JA, _JEQ_K, _JSET_K, _JGT_X, _RET_K = 0x05, 0x15, 0x45, 0x2D, 0x06
_SKF_AD_PKTTYPE = (-0x1000 + 4) & 0xFFFFFFFF  # ancillary load: the packet's pkttype
_SYN_FIN_RST = 0x07


def capture_filter(port: int) -> list[tuple[int, int, int, int]]:
    """The BPF program (``(code, jt, jf, k)`` each): IPv4 or IPv6 TCP with ``port`` as its
    source (kept when it arrives, ``PACKET_HOST``) or its destination (kept when it leaves,
    ``PACKET_OUTGOING``) that carries data or a SYN, FIN or RST (a bare ACK tells the analysis
    nothing and is half the packets). IPv4 fragments after the first and IPv6 extension
    headers are not kept (a TCP stream on an endpoint's port carries neither).

    Scratch memory: M[0] the TCP header's offset, M[1] the IP packet's length."""
    # (label, code, k, true-label, false-label); jumps resolved to forward offsets below
    prog: list[tuple[str, int, int, str, str]] = [
        ("", _LD_B_ABS, 0, "", ""),
        ("", _ALU_AND_K, 0xF0, "", ""),
        ("", _JEQ_K, 0x40, "v4", "not4"),
        ("not4", _JEQ_K, 0x60, "v6", "drop"),
        ("v4", _LD_B_ABS, 9, "", ""),
        ("", _JEQ_K, 6, "v4tcp", "drop"),
        ("v4tcp", _LD_H_ABS, 6, "", ""),
        ("", _JSET_K, 0x1FFF, "drop", "v4head"),
        ("v4head", _LDX_B_MSH, 0, "", ""),  # X = IPv4 header length
        ("", _LD_H_ABS, 2, "", ""),  # total length
        ("", _ST, 1, "", ""),
        ("", _JA, 0, "tcp", ""),
        ("v6", _LD_B_ABS, 6, "", ""),
        ("", _JEQ_K, 6, "v6tcp", "drop"),
        ("v6tcp", _LDX_IMM, 40, "", ""),
        ("", _LD_H_ABS, 4, "", ""),  # payload length, after the 40-byte header
        ("", _ALU_ADD_K, 40, "", ""),
        ("", _ST, 1, "", ""),
        ("tcp", _STX, 0, "", ""),
        ("", _LD_B_IND, 13, "", ""),  # TCP flags
        ("", _JSET_K, _SYN_FIN_RST, "ports", "data"),
        ("data", _LD_B_IND, 12, "", ""),  # data offset << 4
        ("", _ALU_RSH_K, 2, "", ""),
        ("", _ALU_AND_K, 0x3C, "", ""),  # TCP header length
        ("", _ALU_ADD_X, 0, "", ""),  # where the payload starts
        ("", _TAX, 0, "", ""),
        ("", _LD_MEM, 1, "", ""),
        ("", _JGT_X, 0, "ports", "drop"),  # the packet goes past it: data
        ("ports", _LDX_MEM, 0, "", ""),
        ("", _LD_H_IND, 0, "", ""),
        ("", _JEQ_K, port, "from_server", "dst"),
        ("dst", _LD_H_IND, 2, "", ""),
        ("", _JEQ_K, port, "to_server", "drop"),
        ("from_server", _LD_W_ABS, _SKF_AD_PKTTYPE, "", ""),
        ("", _JEQ_K, PACKET_HOST, "accept", "drop"),
        ("to_server", _LD_W_ABS, _SKF_AD_PKTTYPE, "", ""),
        ("", _JEQ_K, PACKET_OUTGOING, "accept", "drop"),
        ("accept", _RET_K, SNAP_BYTES, "", ""),
        ("drop", _RET_K, 0, "", ""),
    ]
    at = {label: i for i, (label, *_rest) in enumerate(prog) if label}
    out = []
    for i, (_label, code, k, jt, jf) in enumerate(prog):
        if code == _JA:
            out.append((code, 0, 0, at[jt] - i - 1))
        elif jt:
            out.append((code, at[jt] - i - 1, at[jf] - i - 1, k))
        else:
            out.append((code, 0, 0, k))
    return out


def _attach(sock: socket.socket, program: list[tuple[int, int, int, int]]) -> None:
    raw = b"".join(struct.pack("HBBI", *ins) for ins in program)
    buf = ctypes.create_string_buffer(raw)
    fprog = struct.pack("HL", len(program), ctypes.addressof(buf))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def open_socket(port: int, interface: str | None) -> socket.socket:
    """A packet socket that receives only ``capture_filter(port)``'s packets, stamped.
    Raises ``PermissionError`` without CAP_NET_RAW."""
    # On one interface: protocol 0 receives nothing until bound, so no packet slips in before
    # the filter. On every interface (no bind): what came before the filter is read away.
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0 if interface else _ALL)
    try:
        _attach(sock, capture_filter(port))
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
        except PermissionError:  # without CAP_NET_ADMIN: as much as rmem_max allows
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
        if interface:
            sock.bind((interface, ETH_P_ALL))
        else:
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                while True:
                    sock.recv(SNAP_BYTES)
            sock.setblocking(True)
    except BaseException:
        sock.close()
        raise
    return sock


def check_capture(interface: str | None = None) -> None:
    """Raises ``ConfigError`` naming CAP_NET_RAW when this process cannot capture (or the
    interface does not exist), before any request is sent."""
    if not sys.platform.startswith("linux"):
        raise ConfigError("--wire captures with a Linux packet socket; this is not Linux")
    try:
        open_socket(1, interface).close()
    except PermissionError as exc:
        raise ConfigError(NEEDS.format(python=sys.executable)) from exc
    except OSError as exc:
        raise ConfigError(f"--interface {interface}: cannot capture there ({exc})") from exc


# ------------------------------------------------------------------ the child process


def _pcap_header() -> bytes:
    return struct.pack("<IHHiIII", PCAP_MAGIC_NS, 2, 4, 0, 0, SNAP_BYTES, LINKTYPE_RAW)


def _drain(sock: socket.socket, out: BinaryIO, counts: dict[str, int]) -> None:
    """Read every packet queued now (the socket is non-blocking) into the pcap file."""
    recv, pack, write = sock.recvmsg, struct.pack, out.write
    unpack_ts = struct.Struct("@qq").unpack
    while True:
        try:
            data, anc, flags, _addr = recv(SNAP_BYTES, 64)
        except BlockingIOError:
            return
        ts = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = unpack_ts(payload[:16])
                ts = (sec, nsec)
        if ts is None:  # not stamped by the kernel: the analysis must not trust it
            counts["unstamped"] += 1
            continue
        if flags & socket.MSG_TRUNC:
            counts["truncated"] += 1
        counts["packets"] += 1
        n = len(data)
        write(pack("<IIII", ts[0], ts[1], n, n))
        write(data)


def _capture(port: int, interface: str | None, path: Path) -> int:
    try:
        sock = open_socket(port, interface)
    except PermissionError:
        print(json.dumps({"error": NEEDS.format(python=sys.executable)}), flush=True)
        return 2
    except OSError as exc:
        print(json.dumps({"error": f"--interface {interface}: {exc}"}), flush=True)
        return 2
    sock.setblocking(False)
    # Behind the sender on the CPU: the kernel stamps each packet as it passes and holds it
    # in the queue, so reading it later costs no accuracy, and the load is never kept waiting.
    os.nice(10)
    counts = {"packets": 0, "unstamped": 0, "truncated": 0}
    stdin = sys.stdin.fileno()
    # the packets hold every byte sent, API keys and prompts included: the owner's eyes only
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with sock, open(fd, "wb", buffering=1 << 20) as out:
        out.write(_pcap_header())
        print(json.dumps({"ready": True}), flush=True)
        while True:
            readable, _, _ = select.select([sock, stdin], [], [])
            if sock in readable:
                _drain(sock, out, counts)
            if stdin in readable and not os.read(stdin, 4096):  # EOF: the load is over
                _drain(sock, out, counts)
                break
        stats = sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
        _seen, dropped = struct.unpack("II", stats)
    print(json.dumps({**counts, "dropped": dropped}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m loadlab._wire.capture", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--port", type=int, required=True, help="the endpoint's TCP port")
    p.add_argument("--interface", help="one interface (default: every interface)")
    p.add_argument("--out", type=Path, required=True, help="pcap file to write")
    args = p.parse_args(argv)
    return _capture(args.port, args.interface, args.out)


# ------------------------------------------------------------------ the parent's handle


@dataclass(frozen=True)
class CaptureResult:
    pcap: Path
    packets: int
    dropped: int  # packets the kernel dropped: the queue was full (the wire is then partial)
    unstamped: int
    truncated: int
    interface: str  # "any" when every interface was captured
    port: int


class Capture:
    """``with Capture(port=P) as cap:`` captures while the block runs (the child is bound and
    filtering when ``__enter__`` returns); afterwards ``cap.result`` and ``cap.clock``.
    ``pcap``: where the packets go (default: a temporary file, removed by ``cleanup``)."""

    def __init__(
        self,
        port: int,
        interface: str | None = None,
        pcap: str | os.PathLike[str] | None = None,
        start_timeout_s: float = 20.0,
    ) -> None:
        self.port = port
        self.interface = interface
        self._own_pcap = pcap is None
        if pcap is None:
            fd, name = tempfile.mkstemp(prefix="loadlab-wire-", suffix=".pcap")
            os.close(fd)
            pcap = name
        self.pcap = Path(pcap)
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self._start: tuple[int, int, int] | None = None
        self.clock: ClockMap | None = None
        self.result: CaptureResult | None = None

    def __enter__(self) -> Capture:
        cmd = [sys.executable, "-m", "loadlab._wire.capture", "--port", str(self.port)]
        cmd += ["--out", str(self.pcap)]
        if self.interface:
            cmd += ["--interface", self.interface]
        self.proc = subprocess.Popen(  # noqa: S603 - this interpreter, our module
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        line = self._line(self.start_timeout_s)
        if not line.get("ready"):
            self._stop()
            raise ConfigError(str(line.get("error") or "the packet capture did not start"))
        self._start = clock_offset_ns()
        return self

    def _line(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None  # noqa: S101
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        text = self.proc.stdout.readline() if ready else ""
        try:
            return dict(json.loads(text)) if text.strip() else {}
        except json.JSONDecodeError:
            return {"error": text.strip()}

    def __exit__(self, *exc: object) -> None:
        end = clock_offset_ns()
        stats = self._stop()
        if self._start is not None:
            self.clock = ClockMap.between(self._start, end)
        if "packets" in stats:
            self.result = CaptureResult(
                self.pcap,
                int(stats["packets"]),
                int(stats["dropped"]),
                int(stats["unstamped"]),
                int(stats["truncated"]),
                self.interface or "any",
                self.port,
            )

    def _stop(self) -> dict[str, Any]:
        proc = self.proc
        if proc is None:
            return {}
        stats: dict[str, Any] = {}
        if proc.stdin is not None:
            proc.stdin.close()  # EOF: the child reads what is queued, then reports
        if proc.stdout is not None:
            stats = self._line(30.0)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        self.proc = None
        return stats

    def cleanup(self) -> None:
        """Remove the pcap file when it was a temporary one."""
        if self._own_pcap:
            self.pcap.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
