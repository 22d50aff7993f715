"""`loadlab run` as a user runs it, with secrets on the command line and in a scenario: none
reaches the results file, the reports or the console, and an injecting header is exit 2."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab.selftest._fixed_server import FixedServerProcess
from tests.helpers.loopback import ROOT

SECRETS = ("pa55word", "s3cretvalue", "blueteam")


@pytest.fixture(scope="module")
def fast_url() -> Iterator[str]:
    with FixedServerProcess(ttft_ms=5, itl_ms=1, tokens=4) as url:
        yield url


def _loadlab(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "loadlab", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_url_userinfo_and_credential_headers_are_never_stored_or_printed(
    fast_url: str, tmp_path: Path
) -> None:
    url = fast_url.replace("http://", "http://user:pa55word@")
    out, html = tmp_path / "r.json", tmp_path / "r.html"
    run = _loadlab("run", "--no-progress", "--endpoint", url, "--model", "m",
                   "--header", "X-Custom-Auth: s3cretvalue", "--header", "X-Team: blueteam",
                   "--redact-header", "x-team", "--scrape", f"{url}/metrics",
                   "--concurrency", "1", "--requests", "2", "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    report = _loadlab("report", str(out), "--html", str(html))
    assert report.returncode == 0, report.stderr
    text = out.read_text() + html.read_text() + run.stdout + run.stderr + report.stdout
    for secret in SECRETS:
        assert secret not in text, secret
    assert fast_url in out.read_text()  # the URL itself is kept, without its user-info


def test_a_header_with_cr_lf_or_nul_is_exit_2(tmp_path: Path) -> None:
    for header in ("X-A: b\r\nX-Injected: yes", "X-A: b\nc", "X-A\rB: c"):
        run = _loadlab("run", "--endpoint", "http://127.0.0.1:9", "--header", header,
                       "--concurrency", "1", "--requests", "1", "--out", str(tmp_path / "x.json"))  # fmt: skip
        assert run.returncode == 2, (header, run.stderr)
        assert "CR, LF or NUL" in run.stderr and "Traceback" not in run.stderr
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        'concurrency = 1\nrequests = 1\n[[endpoints]]\nurl = "http://127.0.0.1:9"\n'
        'headers = { "X-A" = "b\\r\\nX-Injected: yes" }\n',
        encoding="utf-8",
    )
    run = _loadlab("run", "--scenario", str(scenario), "--out", str(tmp_path / "x.json"))
    assert run.returncode == 2, run.stderr
    assert f"{scenario}: header 'X-A' holds a CR, LF or NUL" in run.stderr
    assert not (tmp_path / "x.json").exists()
