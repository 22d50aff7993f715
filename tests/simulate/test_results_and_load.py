"""The client side of a simulation (open and closed loop, chat history, stop rules, refusals)
and its results file, read back by the same metric, report and SLO code as a measured one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadlab._analysis import metrics
from loadlab._analysis.summary import summarize
from loadlab.config import RunConfig
from loadlab.records import RequestRecord, RequestSpec
from loadlab.results import Results, read_results, write_results
from loadlab.simulate import LinearStepTime, ServerConfig, Simulator, is_predicted
from loadlab.workloads import build_requests

MODEL = LinearStepTime(base_s=0.010, per_prefill_token_s=0.0001, per_decode_token_s=0.0011)
ROOT = Path(__file__).resolve().parents[2]


def sim(cfg: RunConfig, specs: list[RequestSpec] | None = None, **server: object):  # type: ignore[no-untyped-def]
    s = ServerConfig(**server)  # type: ignore[arg-type]
    return Simulator(cfg, s, MODEL).run(specs if specs is not None else build_requests(cfg))


def test_predicted_file_goes_through_the_same_metric_code(tmp_path: Path) -> None:
    """One request alone, written and read back: the metric functions give the hand-computed
    TTFT, ITL and E2E, exactly as they would for a measured record with those timestamps."""
    cfg = RunConfig(rate_rps=1.0, requests=1)
    out = sim(cfg, [RequestSpec("a", "x" * 100, 3, intended_at_s=0.5, prompt_tokens=100)])
    path = write_results(out.to_results(), tmp_path / "p.json")
    res = read_results(path)
    assert is_predicted(res) and res.kind == "simulate" and res.config["predicted"] is True
    rec = res.records[0]
    measured = RequestRecord("m", sent_ns=500_000_000, intended_ns=500_000_000,
                             chunk_ns=[520_000_000, 531_100_000, 542_200_000],
                             chunk_tokens=[1, 1, 1], output_tokens=3)  # fmt: skip
    for r in (rec, measured):
        assert metrics.ttft_ms(r) == pytest.approx(20.0)
        assert metrics.e2e_ms(r) == pytest.approx(42.2)
        assert metrics.tpot_ms(r) == pytest.approx(11.1)
    assert rec.output_tokens == 3 and rec.prompt_tokens == 100 and rec.server["predicted"]
    assert rec.server["queue_ms"] == pytest.approx(0.0)
    summary = summarize(res)
    assert summary == summarize(Results.from_dict(json.loads(path.read_text())))


@pytest.mark.parametrize("media", ["image_tokens", "audio_tokens"])
def test_media_tokens_are_prefilled_as_text_is(media: str) -> None:
    """A request with 200 image (or audio) tokens beside 100 text tokens costs the prefill of
    300 (TTFT 10 ms + 300 x 0.1 ms), and its prompt counts them, as a server's usage does."""
    cfg = RunConfig(rate_rps=1.0, requests=1)
    spec = RequestSpec("a", "x" * 100, 3, intended_at_s=0.5, prompt_tokens=100, **{media: 200})
    rec = sim(cfg, [spec]).to_results().records[0]
    assert metrics.ttft_ms(rec) == pytest.approx(40.0)
    assert rec.prompt_tokens == 300


def test_report_slo_and_compare_read_a_predicted_file(tmp_path: Path) -> None:
    cfg = RunConfig(rate_rps=5.0, requests=40, prompt_tokens=64, max_tokens=16)
    a = write_results(sim(cfg).to_results(), tmp_path / "a.json")
    b = write_results(sim(cfg, mode="static").to_results(), tmp_path / "b.json")
    slo = tmp_path / "slo.toml"
    slo.write_text(
        'min_requests = 10\nobjectives = ["ttft_ms.p90 <= 10000", "itl_ms.p99 <= 1000"]\n'
    )
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    for argv in (
        ["report", str(a)],
        ["slo", str(a), "--slo", str(slo)],
        ["compare", str(a), str(b)],
    ):
        done = subprocess.run([sys.executable, "-m", "loadlab", *argv], capture_output=True,
                              text=True, env=env, timeout=120, cwd=ROOT)  # fmt: skip
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        assert "simulate" in done.stdout or argv[0] != "report"


def test_closed_loop_keeps_concurrency_and_chat_history_grows() -> None:
    """Closed loop of 2: at most two requests in flight; a chat session's second turn carries
    the first prompt, the first answer and two joins, sent think time after the answer."""
    cfg = RunConfig(concurrency=2, requests=8, workload={"kind": "chat", "sessions": 4,
                    "turns": 2, "prompt_tokens": 20, "output_tokens": 5, "think_time_s": 0.5})  # fmt: skip
    out = sim(cfg)
    reqs = out.requests
    assert len(reqs) == 8 and all(r.outcome == "ok" for r in reqs)
    by_session: dict[str, list] = {}  # type: ignore[type-arg]
    for r in reqs:
        by_session.setdefault(r.spec.session_id, []).append(r)
    for turns in by_session.values():
        t0, t1 = sorted(turns, key=lambda r: r.spec.turn)
        assert t1.prompt_tokens == t0.prompt_tokens + 5 + (t1.spec.prompt_tokens or 0) + 2
        assert t1.arrival_s == pytest.approx(t0.end_s + 0.5)
    events = sorted([(r.arrival_s, 1) for r in reqs] + [(r.end_s, -1) for r in reqs])
    live = peak = 0
    for _, d in events:
        live += d
        peak = max(peak, live)
    assert peak <= 2


def test_refusals_timeouts_and_drops() -> None:
    specs = [RequestSpec(f"r{i}", "x", 200, intended_at_s=0.0, prompt_tokens=10) for i in range(6)]
    # over the context: 400
    out = sim(RunConfig(rate_rps=1.0, requests=6), specs, max_model_len=100)
    assert {r.outcome for r in out.requests} == {"http_400"}
    # one slot, no queue: the first runs, the rest get 429 at once
    out = sim(RunConfig(rate_rps=1.0, requests=6), specs, max_num_seqs=1, max_queue=0)
    assert [r.outcome for r in out.requests] == ["ok"] + ["http_429"] * 5
    # a 1 s timeout: each request needs about 2.4 s alone
    out = sim(RunConfig(rate_rps=1.0, requests=6, timeout_s=1.0), specs, max_num_seqs=1)
    rec = out.to_results().records
    assert all(r.outcome == "timeout" for r in rec)
    assert all(r.end_ns == r.sent_ns + 1_000_000_000 for r in rec)
    assert 0 < rec[0].output_tokens < 200 and rec[1].output_tokens == 0
    # client cap: dropped, never sent
    out = sim(RunConfig(rate_rps=1.0, requests=6, max_in_flight=2), specs)
    assert [r.outcome for r in out.requests] == ["ok", "ok"] + ["dropped"] * 4
    # a duration run: nothing is sent at or after it
    late = [*specs[:2], RequestSpec("z", "x", 5, intended_at_s=3.0, prompt_tokens=10)]
    out = sim(RunConfig(rate_rps=1.0, duration_s=2.0, timeout_s=0.5), late, max_num_seqs=1)
    assert [r.outcome for r in out.requests] == ["timeout", "timeout"]


def test_same_seed_same_prediction() -> None:
    cfg = RunConfig(rate_rps=20.0, duration_s=5.0, workload={"kind": "synthetic",
                    "prompt_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.5},
                    "output_tokens": {"dist": "uniform", "low": 10, "high": 100}})  # fmt: skip
    a = sim(cfg).to_results().records
    b = sim(cfg).to_results().records
    assert [r.chunk_ns for r in a] == [r.chunk_ns for r in b]


def test_simulate_command_writes_a_predicted_file(tmp_path: Path) -> None:
    model = tmp_path / "fit.json"
    model.write_text(json.dumps(LinearStepTime(0.01, 1e-4, 1.1e-3).to_dict()))
    out = tmp_path / "pred.json"
    slo = tmp_path / "slo.toml"
    slo.write_text('min_requests = 5\nobjectives = ["ttft_ms.p90 <= 1"]\n')
    argv = ["simulate", "--rate", "5", "--requests", "20", "--mode", "disaggregated",
            "--step-model", str(model), "--out", str(out), "--slo", str(slo)]  # fmt: skip
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "loadlab", *argv], capture_output=True,
                          text=True, env=env, timeout=120, cwd=ROOT)  # fmt: skip
    assert done.returncode == 1, done.stderr  # the prediction misses a 1 ms TTFT: the SLO fails
    res = read_results(out)
    assert is_predicted(res) and len(res.records) == 20
    assert res.config["simulate"]["server"]["mode"] == "disaggregated"
    assert "predicted:" in done.stdout and "kind simulate" in done.stdout


@pytest.mark.parametrize(("rate", "overloaded"), [(200.0, True), (2.0, False)])
def test_simulate_says_when_the_simulated_server_cannot_keep_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rate: float, overloaded: bool
) -> None:
    """Past what the server turns over, the queue grows without bound and TTFT grows with
    the run's length: the prediction says so instead of printing those percentiles alone."""
    from loadlab.cli import main

    model = tmp_path / "fit.json"
    model.write_text(json.dumps(LinearStepTime(0.01, 1e-4, 1.1e-3).to_dict()))
    scenario = tmp_path / "s.toml"
    scenario.write_text('arrival = "constant"\nduration_s = 10\n[workload]\nkind = "synthetic"\n'
                        "prompt_tokens = 512\noutput_tokens = 32\n")  # fmt: skip
    argv = ["simulate", "--scenario", str(scenario), "--rate", str(rate), "--step-model",
            str(model), "--extrapolate", "--out", str(tmp_path / "p.json")]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert ("the simulated server is OVERLOADED: requests arrived at" in err) is overloaded, err
    if overloaded:
        assert "the queue grows without bound" in err
