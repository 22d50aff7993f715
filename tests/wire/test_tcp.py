"""TCP reassembly of hand-made captures: order, retransmissions, gaps, wrap, reuse."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from loadlab._wire.tcp import Connection, Stream, read_pcap, reassemble
from tests.helpers.wire import Conversation, write_pcap


def _one(conv: Conversation) -> Connection:
    streams = reassemble(conv.packets, conv.server_port)
    assert len(streams.connections) == 1
    return streams.connections[0]


def _to_client(*segments: tuple[bytes, int, int]) -> Stream:
    """What one connection's server sent, from its segments ``(data, time, seq)`` in the
    order they came."""
    conv = Conversation()
    conv.syn(0)
    for data, t, seq in segments:
        conv.server(data, t, seq=seq)
    return _one(conv).to_client


def test_in_order_bytes_keep_their_packet_times() -> None:
    conv = Conversation()
    conv.syn(0)
    conv.client(b"ping", 10)
    conv.server(b"abc", 20)
    conv.server(b"def", 30)
    conn = _one(conv)
    assert conn.to_server.data == b"ping" and conn.to_client.data == b"abcdef"
    assert [conn.to_client.time_at(i) for i in range(6)] == [20, 20, 20, 30, 30, 30]
    assert conn.client == ("127.0.0.1", 40000) and conn.server == ("127.0.0.1", 8000)


def test_bytes_after_a_hole_are_readable_when_it_fills() -> None:
    got = _to_client((b"def", 20, 3), (b"abc", 30, 0))  # "def" arrives first
    assert got.data == b"abcdef" and got.complete
    assert got.time_at(0) == 30 and got.time_at(5) == 30


def test_a_retransmission_keeps_the_first_copy_time() -> None:
    # the third overlaps what came and brings "def"
    got = _to_client((b"abc", 20, 0), (b"abc", 25, 0), (b"bcdef", 30, 1))
    assert got.data == b"abcdef"
    assert got.time_at(2) == 20 and got.time_at(3) == 30


def test_a_hole_never_filled_cuts_the_stream() -> None:
    got = _to_client((b"abc", 20, 0), (b"ghi", 40, 6))
    assert got.data == b"abc" and not got.complete


def test_sequence_numbers_wrap() -> None:
    conv = Conversation(server_isn=0xFFFFFFF0)
    conv.syn(0)
    body = bytes(range(256)) * 4
    for i in range(0, len(body), 100):
        conv.server(body[i : i + 100], 10 + i)
    assert _one(conv).to_client.data == body


def test_connections_without_their_syn_are_left_out_and_counted() -> None:
    conv = Conversation()
    conv.client(b"GET", 10)
    conv.server(b"HTTP", 20)
    streams = reassemble(conv.packets, 8000)
    assert streams.connections == [] and streams.partial == 1


def test_a_port_pair_reused_is_two_connections() -> None:
    first, second = Conversation(client_isn=100), Conversation(client_isn=900_000, server_isn=7)
    first.syn(0)
    first.server(b"one", 10)
    first.fin(20)
    second.syn(30)
    second.server(b"two", 40)
    streams = reassemble(first.packets + second.packets, 8000)
    assert [c.to_client.data for c in streams.connections] == [b"one", b"two"]


def test_only_the_server_port_and_addresses_asked_for() -> None:
    ours, other_port = Conversation(), Conversation(client_port=40001, server_port=9000)
    for conv in (ours, other_port):
        conv.syn(0)
        conv.server(b"x", 10)
    packets = ours.packets + other_port.packets
    assert len(reassemble(packets, 8000).connections) == 1
    assert len(reassemble(packets, 8000, {"127.0.0.1"}).connections) == 1
    assert reassemble(packets, 8000, {"10.0.0.1"}).connections == []


def test_pcap_round_trip(tmp_path: Path) -> None:
    conv = Conversation()
    conv.syn(1_700_000_000_123_456_789)
    conv.client(b"hello", 1_700_000_000_223_456_789)
    path = write_pcap(tmp_path / "c.pcap", conv.packets)
    assert list(read_pcap(path)) == conv.packets


def test_pcap_in_microseconds_and_bad_files(tmp_path: Path) -> None:
    conv = Conversation()
    conv.syn(5_000)
    head = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 101)
    rec = struct.pack("<IIII", 1, 7, len(conv.packets[0][1]), len(conv.packets[0][1]))
    (tmp_path / "us.pcap").write_bytes(head + rec + conv.packets[0][1])
    assert next(read_pcap(tmp_path / "us.pcap"))[0] == 1_000_007_000
    (tmp_path / "bad.pcap").write_bytes(b"\0" * 24)
    with pytest.raises(ValueError, match="not a pcap"):
        list(read_pcap(tmp_path / "bad.pcap"))
    (tmp_path / "eth.pcap").write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    with pytest.raises(ValueError, match="link type 1"):
        list(read_pcap(tmp_path / "eth.pcap"))
