"""Input a careless or hostile user gives: refused up front (exit 2, naming the flag or file
and the fix) or judged for what it is, against the fixed-schedule server on loopback."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab.cli import main
from loadlab.results import read_results
from loadlab.selftest._fixed_server import FixedServerProcess
from tests.helpers.canned import CannedServer, response, sse_response
from tests.helpers.proxy import ForwardProxy

SLO = "examples/slo.toml"


@pytest.fixture(scope="module")
def fast_url() -> Iterator[str]:
    with FixedServerProcess(ttft_ms=5, itl_ms=1, tokens=4) as url:
        yield url


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # whatever HTTP_PROXY says


def _truth(url: str) -> dict[str, object]:
    with _DIRECT.open(f"{url}/truth", timeout=10) as resp:
        return dict(json.loads(resp.read()))


def _reset(url: str) -> None:
    reset = urllib.request.Request(f"{url}/truth/reset", method="POST")  # noqa: S310 - loopback
    _DIRECT.open(reset, timeout=10).close()


def _run(url: str, out: Path, *args: str) -> int:
    return main(["run", "--endpoint", url, "--no-progress", "--tokenizer", "none",
                 "--max-tokens", "4", "--out", str(out), *args])  # fmt: skip


@pytest.mark.parametrize(("warmup", "cooldown"), [("5", "0"), ("3", "2"), ("9", "0")])
def test_warmup_that_covers_the_run_is_refused_before_any_request(
    fast_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], warmup: str, cooldown: str
) -> None:
    _reset(fast_url)
    out = tmp_path / "r.json"
    code = _run(fast_url, out, "--concurrency", "1", "--duration", "5", "--warmup", warmup,
                "--cooldown", cooldown)  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert f"--warmup {warmup} s and --cooldown {cooldown} s leave no measurement window" in err
    assert "--duration 5 s" in err
    assert _truth(fast_url) == {} and not out.exists()


def test_slo_on_a_run_without_a_measurement_window_is_not_valid_evidence(
    fast_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run stopped by --requests before its warm-up ended measured nothing: not a FAIL."""
    out = tmp_path / "r.json"
    assert _run(fast_url, out, "--concurrency", "1", "--requests", "12", "--warmup", "600") == 0
    capsys.readouterr()
    code = main(["slo", str(out), "--slo", SLO])
    printed = capsys.readouterr().out
    assert code == 2, printed
    assert "NOT VALID EVIDENCE: the run has no measurement window" in printed
    assert "verdict: INVALID (exit 2)" in printed


def _chat_stream(usage: dict[str, object], tokens: int = 3) -> bytes:
    delta = [{"choices": [{"index": 0, "delta": {"content": "tok "}}]}] * tokens
    return sse_response([
        {"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        *delta,
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        {"choices": [], "usage": usage},
    ])  # fmt: skip


def test_negative_usage_is_not_taken(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A server that says completion_tokens -5573 once made "output -5,573 tok/s": the count
    falls back to the streamed chunks and each record says its usage disagreed."""
    bad = {"prompt_tokens": -8, "completion_tokens": -5573, "total_tokens": -5581}
    out = tmp_path / "r.json"
    with CannedServer({"/v1/chat/completions": _chat_stream(bad)}) as srv:
        code = _run(srv.url, out, "--model", "m", "--concurrency", "1", "--requests", "4")
    printed = capsys.readouterr().out
    assert code == 0, printed
    res = read_results(out)
    assert [(r.output_tokens, r.output_tokens_source) for r in res.records] == [(3, "chunks")] * 4
    assert all(r.output_tokens_disagree and r.prompt_tokens is None for r in res.records)
    assert "output -" not in printed and "total -" not in printed
    assert "4 requests: server usage and streamed chunks disagree" in printed


EVIL = "\x1b]0;pwned\x07\x1b[2J\x1b[H\r\nall requests ok \u202eko\x9b31m"


@pytest.mark.parametrize("how", ["stream", "status"])
def test_a_servers_error_text_cannot_drive_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """Escape sequences in an error once set the terminal's title, cleared the screen and
    forged a line ("all requests ok"); they are printed as their escapes everywhere: an error
    inside a 200 stream (its message parsed out of JSON) and a 500's raw body."""
    if how == "stream":
        answer = sse_response([{"error": {"message": EVIL, "type": "server_error"}}])
    else:
        answer = response("500 Oops\x1b[2J", EVIL.encode("utf-8"))
    out = tmp_path / "r.json"
    with CannedServer({"/v1/chat/completions": answer}) as srv:
        _run(srv.url, out, "--model", "m", "--concurrency", "1", "--requests", "3")
    html, csv = tmp_path / "r.html", tmp_path / "r.csv"
    assert main(["report", str(out), "--html", str(html), "--csv", str(csv)]) == 0
    captured = capsys.readouterr()
    for text in (captured.out, captured.err, html.read_text(), csv.read_text(), out.read_text()):
        assert not set(text) & set("\x1b\x07\r\x9b\u202e"), repr(text[:300])
        assert "\nall requests ok" not in text
    assert "first error: " in captured.out
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in captured.out


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[ForwardProxy]:
    """HTTP_PROXY at a real proxy on loopback, and no NO_PROXY: a machine's default NO_PROXY
    often exempts 127.0.0.1, which would hide whether the proxy is used at all."""
    with ForwardProxy() as proxy:
        for name in (
            "no_proxy",
            "NO_PROXY",
            "https_proxy",
            "HTTPS_PROXY",
            "all_proxy",
            "ALL_PROXY",
        ):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("http_proxy", proxy.url)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        yield proxy


def test_aiohttp_goes_through_the_proxy_the_environment_names(
    fast_url: str, tmp_path: Path, proxy_env: ForwardProxy
) -> None:
    out = tmp_path / "r.json"
    code = _run(fast_url, out, "--transport", "aiohttp", "--concurrency", "2", "--requests", "6")
    assert code == 0
    assert all(r.ok for r in read_results(out).records)
    assert proxy_env.proxied == [f"POST {fast_url}/v1/chat/completions HTTP/1.1"] * 6


@pytest.mark.parametrize("workers", ["1", "2"])
def test_raw_transport_refuses_a_proxy_it_would_bypass(
    fast_url: str,
    tmp_path: Path,
    proxy_env: ForwardProxy,
    capsys: pytest.CaptureFixture[str],
    workers: str,
) -> None:
    _reset(fast_url)
    out = tmp_path / "r.json"
    assert _run(fast_url, out, "--workers", workers, "--concurrency", "2", "--requests", "3") == 2
    err = capsys.readouterr().err
    assert f"HTTP_PROXY names a proxy ({proxy_env.url}) for {fast_url}" in err
    assert "add --transport aiohttp" in err and "NO_PROXY" in err
    assert _truth(fast_url) == {} and proxy_env.proxied == [] and not out.exists()


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_no_proxy_exempts_the_endpoint(
    fast_url: str,
    tmp_path: Path,
    proxy_env: ForwardProxy,
    monkeypatch: pytest.MonkeyPatch,
    transport: str,
) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    out = tmp_path / "r.json"
    assert (
        _run(fast_url, out, "--transport", transport, "--concurrency", "1", "--requests", "3") == 0
    )
    assert all(r.ok for r in read_results(out).records) and proxy_env.proxied == []


def test_scrape_that_wants_a_key_is_said_on_the_console(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A /metrics that answers 401 once failed every sample without a word."""
    unauthorized = response("401 Unauthorized", b'{"error": "missing API key"}')
    routes = {"/v1/chat/completions": _chat_stream({"completion_tokens": 3}),
              "/metrics": unauthorized}  # fmt: skip
    out = tmp_path / "r.json"
    with CannedServer(routes) as srv:
        code = _run(srv.url, out, "--model", "m", "--concurrency", "1", "--requests", "4",
                    "--scrape", f"{srv.url}/metrics", "--scrape-interval", "0.05")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0
    assert f"--scrape {srv.url}/metrics: HTTP 401: the server wants credentials" in err
    failed = read_results(out).extra["scrape"]["failures"]
    assert failed >= 2 and f"{failed} of {failed} samples failed (last: HTTP 401" in err


def test_a_redirects_error_names_its_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = "https://user:pw@elsewhere.example/v1/chat/completions"
    moved = response("301 Moved Permanently", b"moved", {"Location": target})
    out = tmp_path / "r.json"
    with CannedServer({"/v1/chat/completions": moved}) as srv:
        assert _run(srv.url, out, "--model", "m", "--concurrency", "1", "--requests", "2") == 3
    printed = capsys.readouterr().out
    shown = "HTTP 301 redirect to https://elsewhere.example/v1/chat/completions (not followed"
    assert f"first error: {shown}" in printed
    assert all(r.error and r.error.startswith(shown) for r in read_results(out).records)
    assert "user:pw" not in printed and "user:pw" not in out.read_text()


@pytest.mark.parametrize(
    ("objective", "why"),
    [
        ("ttft_ms.p95 <= -5", "ttft_ms is never negative"),
        ("itl_ms.p99 < 0", "itl_ms is never negative"),
        ("error_rate >= 1.5", "error_rate is a fraction from 0 to 1"),
        ("output_tokens_per_s < 0", "output_tokens_per_s is never negative"),
    ],
)
def test_an_slo_that_can_never_pass_is_refused_before_any_request(
    fast_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], objective: str, why: str
) -> None:
    _reset(fast_url)
    slo = tmp_path / "slo.toml"
    slo.write_text(f'objectives = ["ttft_ms.p50 <= 500", "{objective}"]\n')
    out = tmp_path / "r.json"
    code = _run(fast_url, out, "--concurrency", "1", "--requests", "3", "--slo", str(slo))
    err = capsys.readouterr().err
    assert code == 2
    assert f"{slo}: objectives[1]: {objective} can never pass: {why}" in err
    assert _truth(fast_url) == {} and not out.exists()


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:99999", "'http://127.0.0.1:99999': the port must be 1 to 65535"),
        ("http://[::1", "'http://[::1': not a URL (Invalid IPv6 URL)"),
        ("http://", "'http://' names no host"),
        ("http://127.0.0.1:0", "'http://127.0.0.1:0': the port must be 1 to 65535"),
        ("http://u:secret@h:70000", "'http://***@h:70000': the port must be 1 to 65535"),
    ],
)
def test_a_malformed_endpoint_url_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, why: str
) -> None:
    assert _run(url, tmp_path / "r.json", "--concurrency", "1", "--requests", "1") == 2
    err = capsys.readouterr().err
    assert f"loadlab run: --endpoint {why}" in err and "Traceback" not in err
    assert "secret" not in err


def _deep_toml(levels: int) -> str:
    return "objectives = " + "[" * levels + "]" * levels + "\n"


def test_files_nested_thousands_deep_are_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """5,000 levels of TOML or 100,000 of JSON once raised RecursionError: exit 1, which
    `loadlab slo` means as FAIL."""
    slo, scenario, results = tmp_path / "slo.toml", tmp_path / "sc.toml", tmp_path / "r.json"
    slo.write_text(_deep_toml(5000))
    scenario.write_text("concurrency = 1\nrequests = 1\n[workload]\nx = " + "[" * 5000 + "]" * 5000)
    results.write_text('{"schema": "loadlab.results", "version": 1, "records": '
                       + "[" * 100_000 + "]" * 100_000 + "}")  # fmt: skip
    good = tmp_path / "good.toml"
    good.write_text('objectives = ["ttft_ms.p50 <= 500"]\n')
    runs = [
        (["slo", str(results), "--slo", str(slo)], str(slo)),
        (["slo", str(results), "--slo", str(good)], str(results)),
        (["report", str(results)], str(results)),
        (["run", "--scenario", str(scenario), "--endpoint", "http://127.0.0.1:9"], str(scenario)),
    ]
    for argv, named in runs:
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        text = captured.out + captured.err
        assert named in text and "nested too deeply" in text and "Traceback" not in text, text
