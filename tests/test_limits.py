"""Every numeric setting is finite, of its type and within its documented range, with the fix
in the message: nothing overflows, wraps or allocates without bound."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from loadlab import cli
from loadlab._limits import machine_limits
from loadlab.config import EndpointConfig, RunConfig
from loadlab.errors import ConfigError
from tests.helpers.loopback import ROOT

EP = ["--endpoint", "http://127.0.0.1:9", "--model", "m"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "inf", "--requests", "3"], "--rate must be a finite number"),
        (["--rate", "nan", "--requests", "3"], "--rate must be a finite number"),
        (["--concurrency", "1", "--duration", "inf"], "--duration must be a finite number"),
        (["--concurrency", "1", "--duration", "1e308"], "--duration must be a finite number"),
        (["--concurrency", "1", "--requests", "1", "--timeout", "inf"], "--timeout must be"),
        (["--concurrency", "1", "--requests", "1", "--warmup", "-1"], "--warmup must be"),
        (
            ["--concurrency", "1", "--requests", "1", "--max-tokens", "99999999999999999999"],
            "--max-tokens must be between 1 and",
        ),
        (
            ["--concurrency", "1", "--requests", "1", "--prompt-tokens", "99999999999999999999"],
            "--prompt-tokens must be between 1 and",
        ),
        (
            ["--concurrency", "99999999999999999999", "--requests", "3"],
            "--concurrency must be between 1 and",
        ),
        (["--rate", "1e6", "--duration", "2"], "--rate must be a finite number"),
        (["--rate", "1000", "--duration", "1e6"], "plans 1e+09 requests"),
        (["--rate", "2", "--requests", "1", "--cv", "inf"], "--cv must be"),
    ],
)
def test_out_of_range_numbers_are_exit_2_with_the_fix(
    args: list[str], message: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", *EP, *args, "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert message in err and "(" in err, err  # the parenthesis holds the fix
    assert not (tmp_path / "r.json").exists()


def test_machine_limits_name_the_open_file_limit() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    lim = machine_limits()
    assert lim.streams_per_process < soft
    with pytest.raises(ConfigError, match="ulimit -n"):
        RunConfig(
            endpoints=(EndpointConfig("http://x"),), concurrency=lim.streams(1) + 1, requests=1
        )
    RunConfig(endpoints=(EndpointConfig("http://x"),), concurrency=lim.streams(1), requests=1)


def test_a_float_count_from_a_scenario_is_refused_not_truncated() -> None:
    with pytest.raises(ConfigError, match="--requests must be a whole number, got 1e\\+20"):
        RunConfig(concurrency=1, requests=1e20)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--concurrency must be a whole number"):
        RunConfig(concurrency=True, requests=1)


def test_a_huge_rate_is_refused_before_it_allocates() -> None:
    """--rate 1e6 --duration 2 used to build gigabytes of arrivals before its first request."""
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so a child of a big pytest
    # process reported the parent's gigabyte; VmHWM belongs to the new address space.
    code = (
        "import re; from loadlab import cli; rc = cli.main(['run', "
        "'--endpoint', 'http://127.0.0.1:9', '--rate', '1e6', '--duration', '2']); "
        "print(rc, re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    rc, max_rss_kib = out.stdout.split()
    assert rc == "2" and int(max_rss_kib) < 300 * 1024, out.stdout + out.stderr
