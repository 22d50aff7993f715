from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers.loopback import free_port


def test_a_run_where_nothing_succeeded_exits_3_and_still_writes_results(tmp_path) -> None:
    out = tmp_path / "dead.json"
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadlab",
            "run",
            "--endpoint",
            dead,
            "--model",
            "m",
            "--concurrency",
            "1",
            "--requests",
            "2",
            "--no-progress",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    assert "no request succeeded" in proc.stderr
    # --tokenizer auto (the default) found nothing to count with: one warning, and the run went on
    assert proc.stderr.count("prompt lengths are estimates at 4 characters per token") == 1
    records = json.loads(out.read_text())["records"]
    assert [r["outcome"] for r in records] == ["connect_error", "connect_error"]
