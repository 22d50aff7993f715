"""loadlab._headers: injection refused, credentials redacted, URL user-info moved to a header."""

from __future__ import annotations

import base64

import pytest

from loadlab._headers import check_header, is_credential, public_url, redact_headers, split_userinfo
from loadlab.config import EndpointConfig, RunConfig
from loadlab.results import redact


@pytest.mark.parametrize(
    ("name", "value"),
    [("X-A", "b\r\nX-Injected: yes"), ("X-A", "b\nc"), ("X-A", "b\x00"), ("X-A\r\nX-B", "c"),
     ("X A", "b"), ("X-A:", "b"), ("", "b")],
)  # fmt: skip
def test_injecting_headers_are_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError, match="header"):
        check_header(name, value)
    with pytest.raises(ValueError, match="header"):
        EndpointConfig("http://127.0.0.1:1", headers={name: value})


def test_plain_headers_pass() -> None:
    check_header("X-Trace-Id", "abc def\t:;,")  # a tab and colons are fine in a value


def test_credential_names_and_user_additions() -> None:
    for name in ("Authorization", "proxy-authorization", "X-Api-Key", "api-key", "Cookie",
                 "Set-Cookie", "X-Auth-Token", "X-Custom-Auth", "x-client-secret", "X-Password"):  # fmt: skip
        assert is_credential(name), name
    for name in ("Content-Type", "X-Trace", "Accept", "anthropic-version", "User-Agent"):
        assert not is_credential(name), name
    assert is_credential("x-trace", ["X-Trace"])
    got = redact_headers({"X-Custom-Auth": "s3", "X-Trace": "t", "X-Team": "x"}, ["x-team"])
    assert got == {"X-Custom-Auth": "***", "X-Trace": "t", "X-Team": "***"}


def test_userinfo_leaves_the_url_and_becomes_basic_auth() -> None:
    url, auth = split_userinfo("https://al%40ice:p%3Ass@h.example:8443/v1?x=1")
    assert url == "https://h.example:8443/v1?x=1"
    assert auth is not None and base64.b64decode(auth.removeprefix("Basic ")) == b"al@ice:p:ss"
    assert split_userinfo("http://h:1/a@b") == ("http://h:1/a@b", None)  # '@' in the path only
    assert public_url("http://user:pw@h/metrics") == "http://h/metrics"
    assert public_url("not a url@all") == "not a url@all"


def test_endpoint_keeps_credentials_only_in_its_headers() -> None:
    ep = EndpointConfig("http://user:pw@127.0.0.1:8000", headers={"X-Trace": "t"})
    assert ep.url == "http://127.0.0.1:8000"
    assert ep.headers["Authorization"].startswith("Basic ") and ep.headers["X-Trace"] == "t"
    mine = EndpointConfig("http://user:pw@127.0.0.1:8000", headers={"authorization": "Bearer k"})
    assert mine.headers == {"authorization": "Bearer k"}  # the user's own header wins


def test_results_config_has_no_secret() -> None:
    ep = EndpointConfig("http://user:pw@127.0.0.1:8000",
                        headers={"X-Custom-Auth": "s3cret", "X-Team": "blue", "X-Ok": "v"})  # fmt: skip
    cfg = RunConfig(endpoints=(ep,), concurrency=1, requests=1,
                    scrape="http://user:pw@127.0.0.1:9/metrics", redact_headers=("X-Team",))  # fmt: skip
    text = repr(redact(cfg.to_dict()))
    for secret in ("pw", "s3cret", "blue", "dXNlcjpwdw"):
        assert secret not in text, secret
    assert "'X-Ok': 'v'" in text and "http://127.0.0.1:9/metrics" in text
    # A results file from elsewhere (Locust, an older run) is cleaned on write as well.
    other = {"locust_host": "http://u:pw@h:1", "headers": {"Cookie": "c=1"}}
    assert redact(other) == {"locust_host": "http://h:1", "headers": {"Cookie": "***"}}
