"""``loadlab-server`` exposed: an address beyond loopback needs a key (or a flag that says so),
and a connection whose request does not arrive in time is closed.

Nothing here binds beyond loopback: the refusal is checked in ``parse_args`` (which runs before
anything binds) and in a real process that exits before it would bind."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from reference_server.cli import parse_args
from reference_server.config import ServerConfig
from reference_server.launch import RunningServer
from tests.helpers.loopback import ROOT
from tests.helpers.server import API_KEY

DEADLINE_S = 0.5
ANY = "0.0.0.0"  # noqa: S104 - never bound here: parse_args refuses it or stops short


@pytest.mark.parametrize("host", [ANY, "::", "192.168.1.10", "gpu-box.internal"])
def test_an_address_beyond_loopback_without_a_key_is_refused(
    host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        parse_args(["--host", host])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"--host {host} serves beyond this machine" in err
    assert "--api-key-env VAR" in err and "--allow-unauthenticated" in err


def test_the_refusal_comes_before_the_model_loads_or_a_socket_binds() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "reference_server.cli", "--host", ANY, "--preset", "tiny"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "serves beyond this machine" in done.stderr
    assert "ready" not in done.stdout and "Traceback" not in done.stderr
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_needs_no_key(host: str) -> None:
    assert parse_args(["--host", host]).host == host


def test_a_key_or_an_explicit_flag_allows_any_address(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOADLAB_EXPOSURE_KEY", "k")
    assert parse_args(["--host", ANY, "--api-key-env", "LOADLAB_EXPOSURE_KEY"]).host
    assert capsys.readouterr().err == ""
    config = parse_args(["--host", ANY, "--allow-unauthenticated"])
    assert config.allow_unauthenticated and parse_args(config.to_argv()) == config
    assert "warning: serving 0.0.0.0 without an API key" in capsys.readouterr().err


# ------------------------------------------------------------------ requests that do not arrive


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    config = ServerConfig(preset="tiny", api_key_env="LOADLAB_TEST_KEY", threads=1,
                          request_read_timeout=DEADLINE_S)  # fmt: skip
    server = RunningServer(config=config, env={"LOADLAB_TEST_KEY": API_KEY}, api_key=API_KEY)
    try:
        yield server.wait_ready().port
    finally:
        server.stop()


HEAD = (
    "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    f"Authorization: Bearer {API_KEY}\r\n"
)


@pytest.mark.parametrize(
    "sent",
    [
        b"",
        b"POST /v1/completions HTTP/1.1\r\nHost: 127",
        (HEAD + "Content-Length: 90\r\n\r\n{").encode(),
    ],
    ids=["idle", "half-header", "half-body"],
)
def test_a_connection_whose_request_does_not_arrive_is_closed(port: int, sent: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(sent)
        started = time.monotonic()
        try:
            got = s.recv(4096)
        except ConnectionResetError:
            got = b""
        waited_s = time.monotonic() - started
    assert got == b""  # closed, with no answer
    assert DEADLINE_S * 0.8 < waited_s < DEADLINE_S + 5.0, waited_s


def test_a_request_that_arrived_is_never_cut(port: int) -> None:
    """A stream longer than the deadline runs to its end; the connection stays usable."""
    body = json.dumps({"model": "loadlab-ref", "prompt": "hi", "max_tokens": 900, "stream": True})
    request = (HEAD + f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        for _ in range(2):  # the second on the same connection, right after the first
            started = time.monotonic()
            s.sendall(request)
            got = b""
            while not (b"data: [DONE]" in got and got.endswith(b"\r\n0\r\n\r\n")):
                chunk = s.recv(65536)
                assert chunk, got[-200:]
                got += chunk
            assert got.startswith(b"HTTP/1.1 200") and got.count(b'"finish_reason":"length"') == 1
        assert time.monotonic() - started > DEADLINE_S  # longer than the deadline, and whole
