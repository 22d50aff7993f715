"""Sweep bisection and knee on a fake, deterministic evaluator (no server)."""

from __future__ import annotations

import pytest

from loadlab._commands.sweep import parse_levels
from loadlab._runner.sweep import Level, find_max_load, knee


def fake(limit: float, calls: list[float]):  # type: ignore[no-untyped-def]
    """Passes at or below ``limit``; latency flat until 0.8 x limit, then steep."""

    def evaluate(load: float) -> Level:
        calls.append(load)
        e2e = 100.0 if load <= 0.8 * limit else 100.0 + 400.0 * (load - 0.8 * limit)
        return Level(load, passed=load <= limit, exit_code=0 if load <= limit else 1,
                     output_tokens_per_s=min(load, limit) * 50, e2e_p95_ms=e2e)  # fmt: skip

    return evaluate


def test_rate_bisection_between_last_pass_and_first_fail() -> None:
    calls: list[float] = []
    r = find_max_load(fake(5.0, calls), [1, 2, 4, 8], bisect_steps=3)
    # coarse: 1, 2, 4 pass; 8 fails (stop). Bisect: 6 fail, 5 pass, 5.5 fail.
    assert calls == [1, 2, 4, 8, 6, 5, 5.5]
    assert r.max_passing_load == 5.0
    assert r.first_failing_load == 5.5
    assert [lv.phase for lv in r.levels] == ["coarse"] * 4 + ["bisect"] * 3


def test_concurrency_bisection_stops_at_adjacent_integers() -> None:
    calls: list[float] = []
    r = find_max_load(fake(11, calls), [1, 2, 4, 8, 16], bisect_steps=10, integer=True)
    # coarse: 1..8 pass, 16 fails; bisect: 12 fail, 10 pass, 11 pass; 11/12 adjacent: stop.
    assert calls == [1, 2, 4, 8, 16, 12, 10, 11]
    assert (r.max_passing_load, r.first_failing_load) == (11, 12)


def test_all_pass_and_all_fail_say_so() -> None:
    calls: list[float] = []
    r = find_max_load(fake(100, calls), [1, 2, 4])
    assert r.max_passing_load == 4 and r.first_failing_load is None
    assert "above the highest level" in r.note
    calls.clear()
    r = find_max_load(fake(0.5, calls), [1, 2, 4])
    assert calls == [1]
    assert r.max_passing_load is None and "lower loads" in r.note
    assert "no level met the SLOs" in r.to_text()


def test_knee_is_where_latency_starts_to_climb() -> None:
    # throughput 50/100/150/200/250 tok/s; e2e 100, 100, 110, 500, 900 ms:
    # normalised x - y = 0, .25, .5 - .0125, .75 - .5, 1 - 1 -> best at load 3 (0.4875)
    lat = {1: 100, 2: 100, 3: 110, 4: 500, 5: 900}
    curve = [Level(x, True, output_tokens_per_s=50 * x, e2e_p95_ms=lat[x]) for x in lat]
    assert knee(curve) == 3
    assert knee(curve[:2]) is None  # too few points


def test_text_table_marks_the_knee_and_the_answer() -> None:
    r = find_max_load(fake(5.0, []), [1, 2, 4, 8], bisect_steps=3)
    text = r.to_text()
    assert "highest load meeting the SLOs: 5 requests/s, next step 5.5 requests/s fails" in text
    assert "<- knee" in text
    assert r.to_dict()["max_passing_load"] == 5.0


def test_levels_are_validated() -> None:
    assert parse_levels("1,2,4", integer=True) == [1.0, 2.0, 4.0]
    with pytest.raises(ValueError, match="rising"):
        parse_levels("4,2", integer=False)
    with pytest.raises(ValueError, match="whole numbers"):
        parse_levels("1,2.5", integer=True)
    with pytest.raises(ValueError, match="rising"):
        find_max_load(fake(1, []), [2, 1])


def test_html_page_escapes_and_embeds_the_plot() -> None:
    from loadlab._runner.sweep import render_html

    r = find_max_load(fake(5.0, []), [1, 2, 4, 8], bisect_steps=1)
    r.note = "<script>alert(1)</script>"
    page = render_html(r)
    assert "data:image/svg+xml;base64," in page
    assert "<script>" not in page and "&lt;script&gt;" in page


@pytest.mark.slow
def test_a_chat_sweep_says_sessions_per_second_with_the_request_rate_beside(tmp_path) -> None:
    """A chat workload's rate counts sessions; at 4 sessions/s of two-turn
    sessions about 8 requests/s go out, and the text says both."""
    from loadlab._runner.run import prepare
    from loadlab._runner.sweep import run_level
    from loadlab._slo import parse_slo
    from loadlab.config import EndpointConfig, RunConfig
    from loadlab.selftest._fixed_server import FixedServerProcess
    from loadlab.workloads import rate_unit

    workload = {"kind": "chat", "turns": 2, "think_time_s": 0.1, "prompt_tokens": 8,
                "output_tokens": 4}  # fmt: skip
    base = RunConfig(rate_rps=1.0, duration_s=4.0, workload=workload, arrival="constant",
                     saturation_lag_ms=1000.0)  # fmt: skip
    spec = parse_slo({"objectives": ["ttft_ms.p90 <= 5000"], "min_requests": 1}, source="t")
    unit = rate_unit(workload)
    with FixedServerProcess(ttft_ms=10, itl_ms=5, tokens=4) as url:
        prepared = prepare(base, EndpointConfig(url=url, name="fx"))

        def evaluate(load: float) -> Level:
            return run_level(base, prepared, spec, load, "rate", tmp_path, inconclusive="pass")

        r = find_max_load(evaluate, [4.0], bisect_steps=0, mode="rate", load_unit=unit)
    lv = r.levels[0]
    assert lv.load * 1.25 < lv.sent_rps <= lv.load * 2.3, lv  # two requests per session
    text = r.to_text()
    assert "load in sessions/s" in text
    # the answer line, or on a machine too loaded for the level to pass, the lowest-tried one
    assert f"4 sessions/s ({lv.sent_rps:.3g} requests/s sent)" in text
    assert r.to_dict()["load_unit"] == "sessions/s"


def test_a_sweep_sizes_its_prompts_once_not_before_every_level(tmp_path, monkeypatch) -> None:
    """The endpoint is asked how it counts tokens once for the whole sweep; each level
    reuses that answer (it asked again before every level)."""
    from loadlab._runner import prompt_sizing as sizing
    from loadlab.cli import main
    from loadlab.selftest._fixed_server import FixedServerProcess

    asked: list[str] = []
    real = sizing.ask_endpoint

    def counting(ep, method):  # type: ignore[no-untyped-def]
        asked.append(method)
        return real(ep, method)

    monkeypatch.setattr(sizing, "ask_endpoint", counting)
    slo = tmp_path / "slo.toml"
    slo.write_text('objectives = ["ttft_ms.p90 <= 60000"]\nmin_requests = 1\n')
    with FixedServerProcess(ttft_ms=5, itl_ms=2, tokens=4) as url:
        code = main(["sweep", "--endpoint", url, "--rates", "2,4", "--duration", "1",
                     "--prompt-tokens", "8", "--max-tokens", "4", "--slo", str(slo),
                     "--inconclusive", "pass", "--out-dir", str(tmp_path / "s"),
                     "--no-progress"])  # fmt: skip
    assert code in (0, 1)  # the verdicts do not matter here
    assert asked == ["auto"]  # once, for two levels


def test_each_level_has_its_own_seed_and_prompts() -> None:
    """Levels of one sweep draw different prompts (a prefix cache would otherwise serve each
    level from the one before); the same sweep seed and load give the same level."""
    from loadlab._runner.sweep import level_config
    from loadlab.config import RunConfig
    from loadlab.workloads import build_requests

    base = RunConfig(rate_rps=1.0, duration_s=4.0, prompt_tokens=64, max_tokens=4)
    cfgs = [level_config(base, load, "rate") for load in (1.0, 2.0, 2)]
    assert cfgs[0].seed != cfgs[1].seed and cfgs[1].seed == cfgs[2].seed
    assert level_config(base.replace(seed=1), 1.0, "rate").seed != cfgs[0].seed
    one, two = ([s.prompt for s in build_requests(c)] for c in cfgs[:2])
    assert len(one) >= 1 and len(two) >= 2
    # no 16-character block (one KV block of the byte tokenizer) of level 2 begins as level 1's
    assert not {p[:16] for p in one} & {p[:16] for p in two}


@pytest.mark.slow
def test_a_later_level_starts_as_cold_as_the_first_on_a_prefix_cache(tmp_path) -> None:
    """Against the reference server with its prefix cache on: the second level of a sweep of
    synthetic prompts finds nothing of the first level's prompts cached (with one seed for
    every level it found 48 of 64 tokens cached in each of its first requests)."""
    launch = pytest.importorskip("reference_server.launch")
    from loadlab.cli import main
    from loadlab.results import read_results

    slo = tmp_path / "slo.toml"
    slo.write_text('objectives = ["ttft_ms.p90 <= 600000"]\nmin_requests = 1\n')
    out = tmp_path / "s"
    with launch.start_server(mode="continuous", preset="fake", timeout_s=90) as server:
        code = main(["sweep", "--endpoint", server.url, "--api", "completions", "--rates",
                     "2,4", "--duration", "2", "--prompt-tokens", "64", "--max-tokens", "4",
                     "--slo", str(slo), "--inconclusive", "pass", "--saturation-lag-ms",
                     "100000", "--bisect-steps", "0", "--out-dir", str(out), "--no-progress"])  # fmt: skip
    assert code in (0, 1)
    for name in ("level-rate-2.json", "level-rate-4.json"):
        records = read_results(out / name).records
        assert records and all(r.outcome == "ok" for r in records), name
        assert sum(r.cached_prompt_tokens or 0 for r in records) == 0, name


def test_an_inconclusive_lowest_level_asks_for_longer_levels_not_lower_loads() -> None:
    """Too few requests (or an interval straddling a threshold) is no measured miss: the
    advice is a longer level, which a lower load cannot give."""

    def evaluate(load: float) -> Level:
        why = "only 12 requests were sent; the SLO asks for at least 100 (min_requests)"
        return Level(load, passed=False, exit_code=2, sent_rps=2.0, failed_objectives=(why,),
                     inconclusive=True, undecided=("min_requests",), more_requests=88)  # fmt: skip

    r = find_max_load(evaluate, [1, 2, 4])
    assert r.note.startswith("the lowest level was not conclusive (min_requests); it needs "
                             "about 88 more requests, at 2 requests/s about 44 s more")  # fmt: skip
    assert "--duration" in r.note and "try lower loads" not in r.note


def test_a_sweep_sets_throughput_floors_aside_and_judges_them_at_its_answer(
    tmp_path, capsys
) -> None:
    """One stream cannot make a throughput floor: the sweep searches on the ceilings (as
    ``capacity --simulate`` does), then says how the highest passing level did on the floors;
    a level with too few requests for the SLO asks for longer levels."""
    from loadlab.cli import main
    from loadlab.selftest._fixed_server import FixedServerProcess

    slo = tmp_path / "slo.toml"
    slo.write_text('objectives = ["ttft_ms.p90 <= 60000", "output_tokens_per_s >= 1e9"]\n'
                   "min_requests = 1\n")  # fmt: skip
    few = tmp_path / "few.toml"
    few.write_text('objectives = ["ttft_ms.p90 <= 60000"]\nmin_requests = 100000\n')
    common = ["--concurrencies", "1,2", "--duration", "1", "--prompt-tokens", "8",
              "--max-tokens", "4", "--inconclusive", "pass", "--bisect-steps", "0",
              "--saturation-lag-ms", "100000", "--no-progress"]  # fmt: skip
    with FixedServerProcess(ttft_ms=5, itl_ms=2, tokens=4) as url:
        code = main(["sweep", "--endpoint", url, "--slo", str(slo),
                     "--out-dir", str(tmp_path / "a"), *common])  # fmt: skip
        out = capsys.readouterr()
        assert code == 0, out.out
        assert "highest load meeting the SLOs: 2 streams" in out.out
        assert "not searched on (floors fail at low load by design): output_tokens_per_s" in out.err
        assert "NOT met: output_tokens_per_s >= 1e+09: measured" in out.out
        assert "  at 2 streams (" in out.out  # the highest passing level
        code = main(["sweep", "--endpoint", url, "--slo", str(few),
                     "--out-dir", str(tmp_path / "b"), *common])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1
    assert "the lowest level was not conclusive" in out and "--duration" in out
    assert "try lower loads" not in out


def test_the_sweep_page_has_the_reports_style_and_the_slo_thresholds() -> None:
    import base64
    import re

    from loadlab._runner.sweep import render_html
    from loadlab._slo import parse_slo

    r = find_max_load(fake(5.0, []), [1, 2, 4, 8], bisect_steps=1)
    spec = parse_slo({"name": "chat", "objectives": ["ttft_ms.p95 <= 500", "e2e_ms.p99 <= 300",
                                                     "output_tokens_per_s >= 1000"]})  # fmt: skip
    page = render_html(r, spec)
    assert "<style>" in page and "Content-Security-Policy" in page
    assert "Highest load meeting the SLOs: 4 requests/s" in page
    assert "ttft_ms.p95 &lt;= 500; e2e_ms.p99 &lt;= 300" in page  # the lines drawn
    assert "output_tokens_per_s" not in page.split("Dashed lines")[1].split("</p>")[0]

    def dashes(html: str) -> int:
        svg = base64.b64decode(re.search(r"base64,([A-Za-z0-9+/=]+)", html).group(1)).decode()
        return svg.count("stroke-dasharray")

    assert dashes(page) == dashes(render_html(r)) + 2  # one dashed line per ceiling
