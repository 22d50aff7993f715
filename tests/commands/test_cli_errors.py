"""The error tree meets the command line in one place: ``cli.main`` maps every
``LoadlabError`` to one line and exit code 2; any other exception is a bug, so it keeps its
traceback and the process exits 1 (never a usage message)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from loadlab import cli, errors
from loadlab.errors import CalibrationError, ConfigError, LoadlabError, UsageError

# --tokenizer none: nothing listens there, and the default (auto) would say so on stderr
# before the run, in a line of its own ("prompt lengths are estimates")
ENDPOINT = ["--endpoint", "http://127.0.0.1:9", "--model", "m", "--concurrency", "1",
            "--tokenizer", "none"]  # fmt: skip


def test_every_error_is_in_the_tree_and_input_errors_stay_value_errors() -> None:
    # errors.py also holds the checks that raise them (at_least, require); every class is in the tree
    classes = [getattr(errors, n) for n in errors.__all__ if isinstance(getattr(errors, n), type)]
    assert len(classes) >= 10
    for cls in classes:
        assert issubclass(cls, LoadlabError), cls
    for cls in (ConfigError, errors.WorkloadError, errors.TraceError, errors.ScenarioError):
        assert issubclass(cls, UsageError) and issubclass(cls, ValueError)
    assert issubclass(errors.ResultsError, UsageError) and issubclass(errors.SLOError, UsageError)
    assert issubclass(CalibrationError, RuntimeError) and not issubclass(
        CalibrationError, UsageError
    )
    # the old homes still export the same classes
    from loadlab._slo import SLOError
    from loadlab.results import ResultsError

    assert ResultsError is errors.ResultsError and SLOError is errors.SLOError


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", *ENDPOINT, "--rate", "2"], "loadlab run: give either --rate"),
        (
            ["run", "--endpoint", "ftp://h", "--requests", "1"],
            "loadlab run: --endpoint 'ftp://h' must start with http",
        ),
        (["report", "missing-results.json"], "loadlab report: "),
        (["compare", "only-one.json"], "loadlab compare: give at least two results files"),
        (["sweep", "--rates", "4,2", "--slo", "x.toml"], "loadlab sweep: load levels must be"),
        (["capacity", "--model", "no-such-model"], "loadlab capacity: "),
        (["lab", "--modes", "warp"], "loadlab lab: --modes takes"),
        (["selftest", "--levels", "a,b"], "loadlab selftest: --levels must be"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_error_of_the_tree_raised_mid_run_is_exit_code_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    def calibration_fails(*_a: object, **_k: object) -> None:
        raise CalibrationError("the endpoint reported no prompt tokens; give --chars-per-token")

    monkeypatch.setattr("loadlab._runner.run.run_prepared", calibration_fails)
    argv = ["run", *ENDPOINT, "--requests", "1", "--out", str(tmp_path / "r.json")]
    assert cli.main(argv) == 2
    assert "loadlab run: the endpoint reported no prompt tokens" in capsys.readouterr().err


def test_a_bug_raising_value_error_mid_run_propagates(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    def bug(*_a: object, **_k: object) -> None:
        raise ValueError("a bug, not bad input")

    monkeypatch.setattr("loadlab._runner.run.run_prepared", bug)
    argv = ["run", *ENDPOINT, "--requests", "1", "--out", str(tmp_path / "r.json")]
    with pytest.raises(ValueError, match="a bug, not bad input"):
        cli.main(argv)


def test_a_bug_mid_run_is_a_traceback_and_exit_code_1(tmp_path) -> None:
    """The same bug in a real process: the interpreter prints the traceback, exit code 1."""
    script = textwrap.dedent(
        f"""
        import sys
        import loadlab._runner.run as run_path
        from loadlab.cli import main

        def bug(*args, **kwargs):
            raise ValueError("a bug, not bad input")

        run_path.run_prepared = bug
        sys.exit(main({["run", *ENDPOINT, "--requests", "1", "--out", str(tmp_path / "r.json")]!r}))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.rstrip().endswith("ValueError: a bug, not bad input")
    assert "loadlab run: a bug" not in proc.stderr  # not turned into an input error
