"""Durable results (issue 17, item 2), with real processes: the output is checked before any
request, records reach the journal as they finish, a kill -9 loses at most the last journal
interval, a full disk at the final write says where the journal is, and ``loadlab report
--from-journal`` rebuilds the results file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab import cli
from loadlab.errors import ConfigError, ResultsError
from loadlab.journal import (
    INTERVAL_S,
    JournalWriter,
    journal_path,
    prepare_output,
    read_journal,
)
from loadlab.records import RequestRecord
from loadlab.results import read_results
from loadlab.selftest.fixed_server import FixedServerProcess
from tests.helpers.loopback import ROOT

# --tokenizer none: the fixed server's truth lists every request it saw, and the default
# (auto) would first send it two calibration requests
RUN = [sys.executable, "-m", "loadlab", "run", "--no-progress", "--prompt-tokens", "8",
       "--tokenizer", "none"]  # fmt: skip


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with FixedServerProcess(ttft_ms=20, itl_ms=10, tokens=32) as u:
        yield u


def _get(url: str, path: str, method: str = "GET") -> bytes:
    req = urllib.request.Request(f"{url}{path}", method=method)  # noqa: S310 - loopback
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
        return bytes(resp.read())


def _truth(url: str) -> dict[str, dict[str, list[int]]]:
    return dict(json.loads(_get(url, "/truth")))


def _mountable() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d"
    return (
        subprocess.run(["unshare", "-rm", "sh", "-c", probe], capture_output=True).returncode == 0
    )


needs_mount = pytest.mark.skipif(not _mountable(), reason="cannot mount a tmpfs (unshare -rm)")


def _in_tmpfs(options: str, argv: list[str], mnt: Path) -> subprocess.CompletedProcess[str]:
    """``argv`` in a private mount namespace where ``mnt`` is a tmpfs mounted with ``options``
    (the disk a user fills or mounts read-only; the server stays reachable on 127.0.0.1)."""
    mnt.mkdir(exist_ok=True)
    quoted = " ".join(f"'{a}'" for a in argv)
    script = (
        f"mount -t tmpfs -o {options} tmpfs '{mnt}' && {quoted}; rc=$?; ls -la '{mnt}'; exit $rc"
    )
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


# ------------------------------------------------------------------ before any request


def test_an_out_that_is_a_directory_is_exit_2_before_any_request(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _get(url, "/truth/reset", "POST")
    argv = [
        "run",
        "--endpoint",
        url,
        "--concurrency",
        "1",
        "--requests",
        "2",
        "--out",
        str(tmp_path),
    ]
    assert cli.main(argv) == 2
    assert f"--out {tmp_path} is a directory" in capsys.readouterr().err
    assert _truth(url) == {} and not list(tmp_path.parent.glob(f"{tmp_path.name}.tmp"))


@needs_mount
@pytest.mark.parametrize(
    ("options", "why"), [("ro,size=1m", "Read-only file system"), ("size=16k", "bytes free")]
)
def test_a_read_only_or_full_disk_is_exit_2_before_any_request(
    url: str, tmp_path: Path, options: str, why: str
) -> None:
    _get(url, "/truth/reset", "POST")
    mnt = tmp_path / "mnt"
    argv = [*RUN, "--endpoint", url, "--concurrency", "1", "--requests", "3",
            "--out", str(mnt / "r.json")]  # fmt: skip
    if options.startswith("size"):  # fill it: a full disk
        argv = ["sh", "-c", f"cat /dev/zero > '{mnt}/fill' 2>/dev/null; exec " + " ".join(argv)]
    done = _in_tmpfs(options, argv, mnt)
    assert done.returncode == 2, done.stdout + done.stderr
    assert why in done.stderr and (
        "choose another --out" in done.stderr or "free some" in done.stderr
    )
    assert "Traceback" not in done.stderr
    assert _truth(url) == {}  # nothing was sent


# ------------------------------------------------------------------ during and after


@needs_mount
def test_a_full_disk_at_the_final_write_says_where_the_journal_is(url: str, tmp_path: Path) -> None:
    """The journal fills part of a small disk; the results file does not fit beside it."""
    mnt = tmp_path / "mnt"
    out = mnt / "r.json"
    rebuilt = tmp_path / "rebuilt.json"
    argv = [*RUN, "--endpoint", url, "--concurrency", "8", "--requests", "200",
            "--max-tokens", "32", "--out", str(out)]  # fmt: skip
    # keep the journal: copy it out of the namespace before its tmpfs goes away
    script_argv = ["sh", "-c", " ".join(f"'{a}'" for a in argv)
                   + f"; rc=$?; cp '{journal_path(out)}' '{tmp_path}/'; exit $rc"]  # fmt: skip
    done = _in_tmpfs("size=256k", script_argv, mnt)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"could not write {out}" in done.stderr and "No space left" in done.stderr
    assert f"--from-journal {journal_path(out)}" in done.stderr
    assert "TTFT" in done.stdout  # the summary is printed all the same
    journal = tmp_path / journal_path(out).name
    assert cli.main(["report", "--from-journal", str(journal), "--out", str(rebuilt)]) == 0
    res = read_results(rebuilt)
    assert len(res.records) == 200 and all(r.ok for r in res.records)
    assert res.extra["from_journal"] == str(journal)


def test_kill_9_loses_at_most_the_last_journal_interval(url: str, tmp_path: Path) -> None:
    _get(url, "/truth/reset", "POST")
    out = tmp_path / "k.json"
    argv = [*RUN, "--endpoint", url, "--concurrency", "4", "--duration", "60",
            "--max-tokens", "32", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(6)
        assert proc.poll() is None, proc.communicate()
        killed_ns = time.perf_counter_ns()  # CLOCK_MONOTONIC: the server's truth clock too
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not out.exists()
    truth = _truth(url)
    margin_ns = int((INTERVAL_S + 0.5) * 1e9)  # the interval, and the client's read after
    finished = {
        rid
        for rid, t in truth.items()
        if t["chunk_ns"] and t["chunk_ns"][-1] < killed_ns - margin_ns
    }
    assert len(finished) > 20
    rebuilt = tmp_path / "rebuilt.json"
    assert (
        cli.main(["report", "--from-journal", str(journal_path(out)), "--out", str(rebuilt)]) == 0
    )
    res = read_results(rebuilt)
    ids = {r.request_id for r in res.records}
    assert finished <= ids, sorted(finished - ids)[:5]
    assert all(r.ok for r in res.records) and res.extra["interrupted"] is True


# ------------------------------------------------------------------ the journal itself


def test_a_journal_write_that_fails_is_noted_and_does_not_stop_the_run(tmp_path: Path) -> None:
    import asyncio

    writer = JournalWriter(tmp_path / "no-such-folder" / "j.jsonl")
    writer.add(RequestRecord("r1", outcome="ok"))
    asyncio.run(writer.close())
    assert writer.error is not None and "No such file" in writer.error and writer.written == 0


def test_a_torn_last_line_is_skipped_and_a_bad_middle_line_is_named(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    journal = prepare_output(out, {"config": {"api_key": "sk-1"}, "kind": "run"})
    rec = json.dumps({"record": RequestRecord("r1", outcome="ok").to_dict()})
    journal.write_text(journal.read_text() + rec + "\n" + rec[:30])
    res = read_journal(journal)
    assert [r.request_id for r in res.records] == ["r1"] and res.config["api_key"] == "***"
    journal.write_text(journal.read_text().splitlines()[0] + "\n{oops\n" + rec + "\n")
    with pytest.raises(ResultsError, match="line 2"):
        read_journal(journal)
    with pytest.raises(ConfigError, match="is a directory"):
        prepare_output(tmp_path, {})


def test_a_run_rebuilt_from_its_journal_says_so_and_is_no_slo_evidence(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The journal a killed run leaves, rebuilt: the text summary and the HTML report say the
    run was interrupted, and ``loadlab slo`` answers "not valid evidence" (exit 2) where the
    same records in a whole run pass."""
    whole = tmp_path / "whole.json"
    assert cli.main([*RUN[3:], "--endpoint", url, "--concurrency", "2", "--requests", "6",
                     "--max-tokens", "4", "--out", str(whole)]) == 0  # fmt: skip
    full = read_results(whole)
    journal = prepare_output(tmp_path / "killed.json", {"kind": "run", "config": full.config})
    with journal.open("a") as f:  # what the journal of a run killed after six requests holds
        f.writelines(json.dumps({"record": r.to_dict()}) + "\n" for r in full.records)
    slo = tmp_path / "slo.toml"
    slo.write_text('objectives = ["ttft_ms.p90 <= 60000"]\nmin_requests = 1\n')
    rebuilt, page = tmp_path / "rebuilt.json", tmp_path / "rebuilt.html"
    capsys.readouterr()
    assert cli.main(["report", "--from-journal", str(journal), "--out", str(rebuilt),
                     "--html", str(page)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert f"INTERRUPTED: rebuilt from the journal {journal}" in text
    assert "INTERRUPTED: rebuilt from the journal" in page.read_text()
    assert cli.main(["slo", str(whole), "--slo", str(slo), "--inconclusive", "pass"]) == 0
    capsys.readouterr()
    assert cli.main(["slo", str(rebuilt), "--slo", str(slo), "--inconclusive", "pass"]) == 2
    out = capsys.readouterr().out
    assert "NOT VALID EVIDENCE: INTERRUPTED" in out and "verdict: INVALID (exit 2)" in out
