"""Durable results, with real processes: the output is checked before any
request, records reach the journal as they finish, a kill -9 loses at most the last journal
interval, a full disk at the final write says where the journal is, and ``loadlab report
--from-journal`` rebuilds the results file."""

from __future__ import annotations

import json
import os
import shlex
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
    JOURNAL_SCHEMA,
    JournalWriter,
    default_out_path,
    journal_path,
    prepare_output,
    read_journal,
)
from loadlab.records import RequestRecord
from loadlab.results import read_results
from loadlab.selftest._fixed_server import FixedServerProcess
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


def _in_tmpfs(
    options: str, argv: list[str], mnt: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` in a private mount namespace where ``mnt`` is a tmpfs mounted with ``options``
    (the disk a user fills or mounts read-only; the server stays reachable on 127.0.0.1)."""
    mnt.mkdir(exist_ok=True)
    quoted = " ".join(shlex.quote(a) for a in argv)
    script = (
        f"mount -t tmpfs -o {options} tmpfs '{mnt}' && {quoted}; rc=$?; ls -la '{mnt}'; exit $rc"
    )
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=env,
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


@pytest.fixture(scope="module")
def fast_url() -> Iterator[str]:
    """Short answers of 64 one-token chunks: records of ~1.5 KB, a few hundred a second."""
    with FixedServerProcess(ttft_ms=5, itl_ms=1, tokens=64) as u:
        yield u


def _filling(mnt: Path, free_kib: int, argv: list[str], after: str = "") -> list[str]:
    """A shell command line: fill the disk at ``mnt`` to ``free_kib`` KiB free, run ``argv``
    (exec'd when nothing comes after it: its pid is the shell's), then ``after``."""
    quoted = " ".join(f"'{a}'" for a in argv)
    fill = f"head -c $(( $(df -k --output=avail '{mnt}' | tail -1) - {free_kib} ))k /dev/zero"
    run = f"{quoted}; rc=$?; {after}; exit $rc" if after else f"exec {quoted}"
    return ["sh", "-c", f"{fill} > '{mnt}/fill'; {run}"]


def _env(**changes: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **changes}


def _full_disk_run(url: str, tmp_path: Path, *flags: str) -> tuple[list[str], Path, Path]:
    """A run's argv writing ``<tmp>/mnt/r.json``, its results file; and the folder on another
    disk that is the run's temporary folder."""
    _get(url, "/truth/reset", "POST")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "mnt" / "r.json"
    return (
        [*RUN, "--endpoint", url, "--max-tokens", "64", *flags, "--out", str(out)],
        out,
        elsewhere,
    )


@needs_mount
@pytest.mark.parametrize("workers", [1, 2])
def test_a_disk_that_fills_during_the_run_keeps_every_record_and_says_where(
    fast_url: str, tmp_path: Path, workers: int
) -> None:
    """2 MB, 256 KiB of it free: the journal fills it mid-run and moves to the temporary
    folder (every worker process follows it there); the results file does not fit either and
    goes there too, and the run says so."""
    argv, out, elsewhere = _full_disk_run(
        fast_url, tmp_path, "--concurrency", "8", "--requests", "600", "--workers", str(workers)
    )
    mnt = out.parent
    done = _in_tmpfs("size=2m", _filling(mnt, 256, argv), mnt, env=_env(TMPDIR=str(elsewhere)))
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr
    assert f"cannot write the journal {journal_path(out)}: No space left on device" in err
    moved_journal = Path(err.split("it continues in ")[1].split()[0])
    assert moved_journal.parent == elsewhere
    assert f"could not write {out}: No space left on device" in err
    results_line = [line for line in done.stdout.splitlines() if line.startswith("results: ")]
    assert len(results_line) == 1 and results_line[0] != f"results: {out}"
    moved_results = Path(results_line[0].removeprefix("results: "))
    assert moved_results.parent == elsewhere and f"are in {moved_results} instead" in err
    assert "every record is in the journal" not in err.lower() and "Traceback" not in err
    res = read_results(moved_results)
    truth = _truth(fast_url)
    assert len(truth) == 600 and {r.request_id for r in res.records} == set(truth)
    assert all(r.ok for r in res.records)
    assert not moved_journal.exists()  # the results file holds every record: no journal left


@needs_mount
def test_with_no_other_disk_the_run_says_how_many_records_the_journal_holds(
    fast_url: str, tmp_path: Path
) -> None:
    """The temporary, home and working folders on the full disk too: nothing to move to. The
    run does not claim the journal holds every record; it says how many it holds, and they
    are there."""
    mnt = tmp_path / "mnt"
    out = mnt / "r.json"
    argv = [*RUN, "--endpoint", fast_url, "--concurrency", "8", "--requests", "400",
            "--max-tokens", "64", "--out", str(out)]  # fmt: skip
    keep = f"cp '{journal_path(out)}' '{tmp_path}/'"  # the namespace's tmpfs goes with it
    env = _env(TMPDIR=str(mnt), HOME=str(mnt))
    script = _filling(mnt, 256, argv, after=keep)
    script[2] = f"cd '{mnt}' && {script[2]}"
    done = _in_tmpfs("size=2m", script, mnt, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "results: " not in done.stdout and "Traceback" not in done.stderr
    assert "no other disk to write to" in done.stderr  # the journal stopped, said so
    held = len(read_journal(tmp_path / journal_path(out).name).records)
    assert 0 < held < 400
    assert f"the journal {journal_path(out)} holds {held} of the 400 records" in done.stderr
    assert f"{400 - held} are lost" in done.stderr
    assert "every record is in the journal" not in done.stderr.lower()


@needs_mount
@pytest.mark.parametrize("workers", [1, 2])
def test_kill_9_after_the_journal_moved_loses_at_most_the_last_interval(
    fast_url: str, tmp_path: Path, workers: int
) -> None:
    argv, out, elsewhere = _full_disk_run(
        fast_url, tmp_path, "--concurrency", "4", "--duration", "60", "--workers", str(workers)
    )
    mnt = out.parent
    log = tmp_path / "err.log"
    script = f"mount -t tmpfs -o size=2m tmpfs '{mnt}' && " + _filling(mnt, 256, argv)[2]
    mnt.mkdir()
    with log.open("wb") as fh:
        proc = subprocess.Popen(["unshare", "-rm", "sh", "-c", script], cwd=ROOT,
                                env=_env(TMPDIR=str(elsewhere)), stdout=subprocess.DEVNULL,
                                stderr=fh)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "it continues in" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        time.sleep(3)  # records after the move
        killed_ns = time.perf_counter_ns()
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    moved = Path(log.read_text().split("it continues in ")[1].split()[0])
    assert moved.parent == elsewhere
    margin_ns = int((INTERVAL_S + 0.5) * 1e9)
    finished = {rid for rid, t in _truth(fast_url).items()
                if t["chunk_ns"] and t["chunk_ns"][-1] < killed_ns - margin_ns}  # fmt: skip
    ids = {r.request_id for r in read_journal(moved).records}
    assert len(finished) > 100 and finished <= ids, sorted(finished - ids)[:5]


def test_kill_9_loses_at_most_the_last_journal_interval(url: str, tmp_path: Path) -> None:
    _get(url, "/truth/reset", "POST")
    out = tmp_path / "k.json"
    argv = [*RUN, "--endpoint", url, "--concurrency", "4", "--duration", "60",
            "--max-tokens", "32", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60  # a loaded machine starts slowly: count records
        while _lines(journal_path(out)) < 40 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2 * INTERVAL_S)  # records finished well before the kill
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


# ------------------------------------------------------------------ runs that share a name


def test_a_second_run_on_the_same_out_stops_at_once_and_a_killed_one_leaves_its_header(
    url: str, tmp_path: Path
) -> None:
    out = tmp_path / "shared.json"
    argv = [*RUN, "--endpoint", url, "--concurrency", "2", "--duration", "60",
            "--max-tokens", "32", "--out", str(out)]  # fmt: skip
    first = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not _lines(journal_path(out)) > 1 and time.monotonic() < deadline:
            assert first.poll() is None, first.communicate()
            time.sleep(0.2)
        started = time.monotonic()
        second = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and time.monotonic() - started < 30
        assert f"--out {out}: another loadlab run is writing it now" in second.stderr
        assert second.stdout == "" and "Traceback" not in second.stderr  # no run, no summary
        assert first.poll() is None
        first.kill()  # kill -9: the journal keeps its header and every record written
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert json.loads(journal_path(out).read_text().splitlines()[0])["schema"] == JOURNAL_SCHEMA
    assert len(read_journal(journal_path(out)).records) >= 1
    third = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert third.returncode == 2, third.stderr
    assert "holds the records of a run that did not finish" in third.stderr
    assert f"loadlab report --from-journal {journal_path(out)} --out NEW.json" in third.stderr


def _lines(path: Path) -> int:
    try:
        return len(path.read_bytes().splitlines())
    except OSError:
        return 0


def test_runs_started_together_without_out_get_their_own_files(url: str, tmp_path: Path) -> None:
    argv = [*RUN, "--endpoint", url, "--concurrency", "1", "--requests", "3"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    files = sorted((tmp_path / "reports").glob("run-*.json"))
    assert len(files) == 2 and all(len(read_results(f).records) == 3 for f in files)
    assert {f"results: reports/{f.name}" for f in files} <= {
        line for o in outs for line in o.splitlines()
    }
    assert not list((tmp_path / "reports").glob("*.journal.jsonl"))
    # one process, one second: still two names
    a = default_out_path("run", folder=str(tmp_path))
    a.write_text("{}")
    assert default_out_path("run", folder=str(tmp_path)) != a


# ------------------------------------------------------------------ the journal itself


def test_a_journal_write_that_fails_is_noted_and_does_not_stop_the_run(tmp_path: Path) -> None:
    import asyncio

    writer = JournalWriter(tmp_path / "no-such-folder" / "j.jsonl")
    writer.add(RequestRecord("r1", outcome="ok"))
    asyncio.run(writer.close())
    assert writer.error is not None and "No such file" in writer.error and writer.written == 0


def test_a_torn_last_line_is_skipped_and_a_journal_of_bad_lines_is_named(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    journal = prepare_output(out, {"config": {"api_key": "sk-1"}, "kind": "run"})
    rec = json.dumps({"record": RequestRecord("r1", outcome="ok").to_dict()})
    journal.write_text(journal.read_text() + rec + "\n" + rec[:30])
    res = read_journal(journal)
    assert [r.request_id for r in res.records] == ["r1"] and res.config["api_key"] == "***"
    assert res.extra["journal"] == {"lines_skipped": 1, "first_skipped": [3], "duplicates": 0}
    journal.write_text(journal.read_text().splitlines()[0] + "\n{oops\n")
    with pytest.raises(ResultsError, match="line 2"):  # nothing readable: not a journal to trust
        read_journal(journal)
    with pytest.raises(ConfigError, match="is a directory"):
        prepare_output(tmp_path, {})


def _real_journal(url: str, tmp_path: Path) -> tuple[Path, list[str]]:
    """A journal of 40 records of a real run (and those records' lines)."""
    first = tmp_path / "first.json"
    assert cli.main(["run", "--endpoint", url, "--concurrency", "4", "--requests", "40",
                     "--prompt-tokens", "8", "--tokenizer", "none", "--no-progress",
                     "--out", str(first)]) == 0  # fmt: skip
    records = read_results(first).records
    journal = prepare_output(tmp_path / "r.json", {"kind": "run", "config": {}})
    JournalWriter(journal).write(records)
    lines = journal.read_text().splitlines()
    assert len(lines) == 41
    return journal, lines


def test_a_torn_line_in_the_middle_is_skipped_counted_and_said(url: str, tmp_path: Path) -> None:
    journal, lines = _real_journal(url, tmp_path)
    torn = lines[20][: len(lines[20]) // 2]  # line 21: half a record, then the next one
    journal.write_text("\n".join([*lines[:20], torn, *lines[21:]]) + "\n")
    rebuilt = tmp_path / "rebuilt.json"
    done = subprocess.run(
        [sys.executable, "-m", "loadlab", "report", "--from-journal", str(journal),
         "--out", str(rebuilt)], cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "skipped 1 line(s) that could not be read (line 21" in done.stderr
    assert "39 records rebuilt" in done.stderr
    res = read_results(rebuilt)
    assert len(res.records) == 39 and res.extra["journal"]["lines_skipped"] == 1


def test_a_journal_with_every_record_twice_is_read_once(url: str, tmp_path: Path) -> None:
    journal, lines = _real_journal(url, tmp_path)
    journal.write_text("\n".join([*lines, *lines[1:]]) + "\n")
    res = read_journal(journal)
    ids = [r.request_id for r in res.records]
    assert len(ids) == 40 == len(set(ids)) and res.scheduled == 40
    assert res.extra["journal"]["duplicates"] == 40
    # what identifies a record: endpoint, worker and request id (Locust workers' ids differ)
    other = RequestRecord(ids[0], worker=1, endpoint=res.records[0].endpoint)
    with journal.open("a") as fh:
        fh.write(json.dumps({"record": other.to_dict()}) + "\n")
    assert len(read_journal(journal).records) == 41


def test_a_run_rebuilt_from_its_journal_says_so_and_is_no_slo_evidence(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The journal a killed run leaves, rebuilt: the text summary and the HTML report say the
    run was interrupted, and ``loadlab slo`` answers "not valid evidence" (exit 2) where the
    same records in a whole run pass."""
    journal, _ = _real_journal(url, tmp_path)
    whole = tmp_path / "first.json"  # the run whose records the journal holds
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
