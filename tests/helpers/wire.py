"""For the wire tests: TCP packets made by hand and pcap files of them, and whether this
process may capture (``needs_capture`` skips a test that must, saying why).

``Conversation`` plays one connection: ``syn()`` opens it, ``client(data, t)`` and
``server(data, t)`` send bytes (at the next sequence number of that side, unless ``seq`` says
otherwise: a retransmission or a segment out of order), ``fin()`` closes it. ``packets``
holds (t_ns, IP packet) in the order given, ready for ``reassemble`` or ``write_pcap``.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from loadlab._wire.capture import LINKTYPE_RAW, PCAP_MAGIC_NS, SNAP_BYTES, open_socket

__all__ = ["Conversation", "capture_missing", "needs_capture", "tcp_packet", "write_pcap"]


def capture_missing() -> str | None:
    """Why this process cannot open a packet socket, or None."""
    try:
        open_socket(1, None).close()
    except PermissionError:
        return "needs root or CAP_NET_RAW (a packet socket)"
    except (OSError, AttributeError) as exc:  # not Linux
        return f"no packet socket here: {exc}"
    return None


needs_capture = pytest.mark.skipif(capture_missing() is not None, reason=str(capture_missing()))

SYN, ACK, FIN = 0x02, 0x10, 0x01


def tcp_packet(
    src: str, sport: int, dst: str, dport: int, seq: int, flags: int, payload: bytes = b""
) -> bytes:
    """One IPv4 packet holding one TCP segment (checksums left zero: nothing checks them)."""
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, 0, 5 << 4, flags, 65535, 0, 0)
    total = 20 + len(tcp) + len(payload)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, 64, 6, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))  # fmt: skip
    return ip + tcp + payload


@dataclass
class Conversation:
    client_port: int = 40000
    server_port: int = 8000
    client_isn: int = 1000
    server_isn: int = 0xFFFFFF00  # wraps past 2**32 after 256 bytes
    host: str = "127.0.0.1"
    packets: list[tuple[int, bytes]] = field(default_factory=list)
    _next: dict[str, int] = field(default_factory=dict)

    def _send(self, side: str, data: bytes, t_ns: int, flags: int, seq: int | None) -> None:
        isn = self.client_isn if side == "c" else self.server_isn
        pos = self._next.get(side, 0) if seq is None else seq
        ports = (self.client_port, self.server_port)
        sport, dport = ports if side == "c" else ports[::-1]
        raw = tcp_packet(self.host, sport, self.host, dport, isn + 1 + pos, flags, data)
        self.packets.append((t_ns, raw))
        if seq is None:
            self._next[side] = pos + len(data)

    def syn(self, t_ns: int = 0) -> None:
        self.packets.append((t_ns, tcp_packet(self.host, self.client_port, self.host,
                                              self.server_port, self.client_isn, SYN)))  # fmt: skip
        self.packets.append((t_ns, tcp_packet(self.host, self.server_port, self.host,
                                              self.client_port, self.server_isn, SYN | ACK)))  # fmt: skip

    def client(self, data: bytes, t_ns: int, seq: int | None = None) -> None:
        self._send("c", data, t_ns, ACK, seq)

    def server(self, data: bytes, t_ns: int, seq: int | None = None) -> None:
        self._send("s", data, t_ns, ACK, seq)

    def fin(self, t_ns: int) -> None:
        self._send("s", b"", t_ns, FIN | ACK, None)
        self._send("c", b"", t_ns, FIN | ACK, None)


def write_pcap(path: Path, packets: list[tuple[int, bytes]]) -> Path:
    """A nanosecond pcap of raw IP packets, as ``loadlab._wire.capture`` writes one."""
    out = [struct.pack("<IHHiIII", PCAP_MAGIC_NS, 2, 4, 0, 0, SNAP_BYTES, LINKTYPE_RAW)]
    for t, raw in packets:
        out.append(struct.pack("<IIII", t // 1_000_000_000, t % 1_000_000_000, len(raw), len(raw)))
        out.append(raw)
    path.write_bytes(b"".join(out))
    return path
