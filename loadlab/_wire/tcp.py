"""TCP streams out of a capture: each connection's two byte streams, and when each byte came.

``read_pcap`` reads what ``loadlab._wire.capture`` wrote (or any pcap of raw IP packets, in
micro- or nanosecond resolution). ``reassemble`` groups the packets by connection (the side
on the server's port is the server) and rebuilds each direction in sequence order: a
retransmitted byte keeps the time of its first copy, and a byte that arrived ahead of a gap
becomes readable only when the gap is filled (``Stream.time_at`` is the running latest
arrival up to that byte), as a client's read would see it. A gap never filled (a dropped
packet) cuts the stream there (``Stream.complete`` is False from it on).

Connections whose SYN is not in the capture started before it: their first bytes may be
missing, so they are left out (counted in ``Streams.partial``).

Example::

    conns = reassemble(read_pcap(path), server_port=8000)
    for c in conns.connections:
        c.to_server.data, c.to_server.time_at(0)
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from socket import AF_INET, AF_INET6, inet_ntop

__all__ = ["Connection", "Packet", "Stream", "Streams", "parse_packet", "read_pcap", "reassemble"]

_SYN, _FIN, _RST = 0x02, 0x01, 0x04
_MAGIC_US, _MAGIC_NS = 0xA1B2C3D4, 0xA1B23C4D
_RAW_LINKTYPES = {101, 228, 229, 12, 14}  # LINKTYPE_RAW, IPV4, IPV6, and BSD's RAW numbers


@dataclass(frozen=True, slots=True)
class Packet:
    t_ns: int  # the kernel's timestamp (CLOCK_REALTIME)
    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    flags: int
    payload: bytes


def read_pcap(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """(timestamp in ns, IP packet) for each record of a pcap file of raw IP packets."""
    data = Path(path).read_bytes()
    if len(data) < 24:
        raise ValueError(f"{path}: not a pcap file (shorter than its header)")
    for endian in "<>":
        magic, _maj, _min, _zone, _sig, _snap, link = struct.unpack(endian + "IHHiIII", data[:24])
        if magic in (_MAGIC_US, _MAGIC_NS):
            break
    else:
        raise ValueError(f"{path}: not a pcap file (magic {data[:4].hex()})")
    if link not in _RAW_LINKTYPES:
        raise ValueError(f"{path}: link type {link}, expected raw IP packets (101)")
    scale = 1 if magic == _MAGIC_NS else 1000
    head = struct.Struct(endian + "IIII")
    pos, n = 24, len(data)
    while pos + 16 <= n:
        sec, frac, caplen, _orig = head.unpack_from(data, pos)
        pos += 16
        yield sec * 1_000_000_000 + frac * scale, data[pos : pos + caplen]
        pos += caplen


def parse_packet(t_ns: int, ip: bytes) -> Packet | None:
    """The TCP segment in one IPv4 or IPv6 packet, or None (not TCP, or cut short)."""
    if len(ip) < 20:
        return None
    version = ip[0] >> 4
    if version == 4:
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack_from("!H", ip, 2)[0]
        if ip[9] != 6 or total < ihl + 20:
            return None
        src, dst = inet_ntop(AF_INET, ip[12:16]), inet_ntop(AF_INET, ip[16:20])
        tcp = ip[ihl:total]
    elif version == 6 and len(ip) >= 60 and ip[6] == 6:
        plen = struct.unpack_from("!H", ip, 4)[0]
        src, dst = inet_ntop(AF_INET6, ip[8:24]), inet_ntop(AF_INET6, ip[24:40])
        tcp = ip[40 : 40 + plen]
    else:
        return None
    if len(tcp) < 20:
        return None
    sport, dport, seq = struct.unpack_from("!HHI", tcp, 0)
    off = (tcp[12] >> 4) * 4
    return Packet(t_ns, src, sport, dst, dport, seq, tcp[13], bytes(tcp[off:]))


@dataclass
class Stream:
    """One direction of a connection: its bytes in order and when each became readable."""

    data: bytes = b""
    starts: list[int] = field(default_factory=list)  # offset where each arrival's bytes begin
    times: list[int] = field(default_factory=list)  # running latest arrival time (ns)
    complete: bool = True  # False: a gap at len(data) was never filled
    closed: bool = False  # a FIN (or RST) came

    def time_at(self, offset: int) -> int:
        """When the byte at ``offset`` was readable: the arrival of the packet carrying it
        (or of an earlier one that filled a gap before it, if later)."""
        return self.times[bisect.bisect_right(self.starts, offset) - 1]


@dataclass
class Connection:
    client: tuple[str, int]
    server: tuple[str, int]
    syn_ns: int
    to_server: Stream
    to_client: Stream


@dataclass
class Streams:
    connections: list[Connection]
    partial: int  # connections without their SYN in the capture (left out)
    packets: int


@dataclass
class _Half:
    isn: int | None = None  # sequence number of the SYN (data starts at isn + 1)
    syn_ns: int | None = None
    segs: list[tuple[int, int, bytes]] = field(default_factory=list)  # (seq, t, payload)
    fin: bool = False


def _build(half: _Half) -> Stream:
    assert half.isn is not None  # noqa: S101 - only halves with a SYN are built
    base = (half.isn + 1) & 0xFFFFFFFF
    segs = []
    for seq, t, payload in half.segs:
        rel = (seq - base) & 0xFFFFFFFF
        if rel >= 1 << 31:  # before the base: a retransmitted SYN's or an old segment's
            continue
        segs.append((rel, t, payload))
    segs.sort(key=lambda s: (s[0], s[1]))
    out = Stream(closed=half.fin)
    chunks: list[bytes] = []
    cur, latest = 0, 0
    for rel, t, payload in segs:
        end = rel + len(payload)
        if rel > cur:
            out.complete = False  # a hole: nothing after it is readable
            break
        if end <= cur:
            continue  # a copy of bytes already in (retransmission)
        latest = max(latest, t)
        out.starts.append(cur)
        out.times.append(latest)
        chunks.append(payload[cur - rel :])
        cur = end
    out.data = b"".join(chunks)
    return out


def reassemble(
    records: Iterable[tuple[int, bytes]],
    server_port: int,
    servers: Collection[str] | None = None,
) -> Streams:
    """Every connection to ``server_port`` (on one of the ``servers`` addresses when given)
    in the capture."""
    halves: dict[tuple[str, int, str, int], list[_Half]] = {}  # a port pair reused: more
    count = 0
    for t_ns, ip in records:
        pkt = parse_packet(t_ns, ip)
        if pkt is None:
            continue
        if pkt.dport == server_port:
            server = pkt.dst
        elif pkt.sport == server_port:
            server = pkt.src
        else:
            continue
        if servers is not None and server not in servers:
            continue
        count += 1
        key = (pkt.src, pkt.sport, pkt.dst, pkt.dport)
        seen = halves.setdefault(key, [])
        if not seen or (pkt.flags & _SYN and seen[-1].isn not in (None, pkt.seq)):
            seen.append(_Half())  # the first packet, or a new connection on this port pair
        half = seen[-1]
        if pkt.flags & _SYN:
            half.isn, half.syn_ns = pkt.seq, pkt.t_ns
        if pkt.payload:
            half.segs.append((pkt.seq, pkt.t_ns, pkt.payload))
        if pkt.flags & (_FIN | _RST):
            half.fin = True
    conns, partial = [], 0
    for (src, sport, dst, dport), seen in halves.items():
        if dport != server_port:
            continue  # the server's halves: taken with the client's
        backs = halves.get((dst, dport, src, sport), [])
        for i, half in enumerate(seen):
            back = backs[i] if i < len(backs) else None
            if half.syn_ns is None or back is None or back.isn is None:
                partial += 1
                continue
            conns.append(
                Connection((src, sport), (dst, dport), half.syn_ns, _build(half), _build(back))
            )
    conns.sort(key=lambda c: c.syn_ns)
    return Streams(conns, partial, count)
