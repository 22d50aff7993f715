"""Prices and a run's bill (``loadlab._analysis.cost``), checked against hand-computed values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loadlab._analysis.cost import (
    Pricing,
    cost_of,
    cost_units,
    load_pricing,
    parse_price_flags,
    pricing_of,
    pricing_tables,
    run_cost,
)
from loadlab.errors import ConfigError
from loadlab.records import RequestRecord
from loadlab.results import Results

S = 1_000_000_000


def rec(rid: str, sent_s: float, end_s: float, prompt: int, cached: int | None, out: int,
        session: str | None = None, outcome: str = "ok") -> RequestRecord:  # fmt: skip
    """A request whose ``out`` tokens arrive one per chunk, evenly up to ``end_s``."""
    chunks = [int((sent_s + (end_s - sent_s) * (k + 1) / out) * S) for k in range(out)]
    return RequestRecord(
        request_id=rid, outcome=outcome, session_id=session, sent_ns=int(sent_s * S),
        chunk_ns=chunks, chunk_tokens=[1] * out, end_ns=chunks[-1], prompt_tokens=prompt,
        cached_prompt_tokens=cached, output_tokens=out, output_tokens_source="usage",
    )  # fmt: skip


def run_of(records: list[RequestRecord], window_s: tuple[float, float], **cfg: object) -> Results:
    return Results(
        records=records,
        window_ns=(int(window_s[0] * S), int(window_s[1] * S)),
        config=dict(cfg),
    )


API = Pricing(
    usd_per_million_input_tokens=1.0,
    usd_per_million_cached_input_tokens=0.25,
    usd_per_million_output_tokens=4.0,
    usd_per_request=0.001,
)


def test_api_bill_prices_cached_input_as_cached() -> None:
    records = [
        rec("a", 0.0, 1.0, prompt=1000, cached=600, out=100, session="s1"),
        rec("b", 1.0, 2.0, prompt=400, cached=None, out=50, session="s1"),
        rec("c", 2.0, 3.0, prompt=200, cached=0, out=10),
        rec("late", 9.0, 9.5, prompt=999, cached=0, out=999),  # sent after the window
        rec("bad", 1.0, 1.5, prompt=999, cached=0, out=5, outcome="http_500"),  # not priced
    ]
    c = run_cost(records, (0, 5 * S), API)
    assert c is not None and c.kind == "api"
    # a: 400 uncached x $1 + 600 cached x $0.25 + 100 out x $4 = 400 + 150 + 400 (per 1e6)
    # b: 400 x 1 + 50 x 4 = 600; c: 200 + 40 = 240; plus $0.001 per request
    usd = (950 + 600 + 240) / 1e6 + 3 * 0.001
    assert c.usd == pytest.approx(usd)
    assert (c.output_tokens, c.requests, c.sessions) == (160, 3, 2)
    assert (c.input_tokens, c.cached_input_tokens, c.usage_requests) == (1600, 600, 3)
    assert c.usd_per_million_output_tokens == pytest.approx(usd / 160 * 1e6)
    assert c.usd_per_1k_requests == pytest.approx(usd / 3 * 1000)
    assert c.usd_per_session == pytest.approx(usd / 2)


def test_cached_price_defaults_to_the_input_price() -> None:
    p = Pricing(usd_per_million_input_tokens=2.0, usd_per_million_output_tokens=0.0)
    assert p.request_usd(rec("a", 0, 1, prompt=100, cached=40, out=1)) == pytest.approx(200 / 1e6)


def test_self_hosted_bill_is_gpu_hours_over_the_window() -> None:
    records = [rec("a", 0.0, 2.0, 10, None, 20, "s"), rec("b", 2.5, 3.5, 10, None, 10, "s"),
               rec("c", 3.0, 8.0, 10, None, 10)]  # fmt: skip  # c ends after the window
    p = Pricing(usd_per_gpu_hour=3.6, gpus=2)
    c = run_cost(records, (0, 4 * S), p)
    assert c is not None and c.kind == "self_hosted"
    # 2 GPUs x $3.6/h x 4 s = $0.008; tokens inside [0, 4 s]: 20 + 10 + c's at 3.5 and 4.0 s
    assert c.usd == pytest.approx(0.008)
    assert c.output_tokens == pytest.approx(32)
    assert (c.requests, c.sessions) == (2, 1)
    assert c.usd_per_million_output_tokens == pytest.approx(0.008 / 32 * 1e6)
    units = cost_units(run_of(records, (0, 4)), p)
    assert units.shape == (4, 4)
    assert units.sum(axis=0) == pytest.approx([0.008, 32, 2, 1])


def test_api_units_are_sessions_and_add_up_to_the_bill() -> None:
    records = [
        rec("a", 0, 1, 10, 0, 5, "s"),
        rec("b", 1, 2, 10, 0, 5, "s"),
        rec("c", 2, 3, 10, 0, 5),
    ]
    res = run_of(records, (0, 5))
    units = cost_units(res, API)
    c = run_cost(records, (0, 5 * S), API)
    assert c is not None
    assert units.shape == (2, 4)
    assert units.sum(axis=0) == pytest.approx([c.usd, 15, 3, 2])


def test_results_keep_prices_by_endpoint(tmp_path: Path) -> None:
    records = [rec("a", 0, 1, 100, 0, 10)]
    for r in records:
        r.endpoint = "vendor"
    tables = {"*": {"usd_per_kwh": 0.1}, "vendor": {"usd_per_million_input_tokens": 1.0,
                                                   "usd_per_million_output_tokens": 2.0}}  # fmt: skip
    res = run_of(records, (0, 2), pricing=tables)
    p = pricing_of(res)
    assert p is not None and p.kind == "api" and p.usd_per_kwh == 0.1
    c = cost_of(res)
    assert c is not None and c.usd == pytest.approx((100 * 1.0 + 10 * 2.0) / 1e6)
    assert cost_of(run_of(records, (0, 2))) is None  # no prices, no figure


def test_pricing_file_and_flags(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text(
        "usd_per_kwh = 0.12\n[endpoints.a]\nusd_per_million_input_tokens = 0.15\n"
        "usd_per_million_output_tokens = 0.6\n[endpoints.ours]\nusd_per_gpu_hour = 2.5\ngpus = 8\n"
    )
    tables = load_pricing(f)
    assert tables["*"] == {"usd_per_kwh": 0.12} and tables["ours"]["gpus"] == 8
    merged = pricing_tables(str(f), ["a:output=0.8"], None)
    assert merged["a"]["usd_per_million_output_tokens"] == 0.8
    assert parse_price_flags(["gpus=2,gpu_hour=1"]) == {"*": {"gpus": 2, "usd_per_gpu_hour": 1.0}}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("usd_per_million_output_tokens = 1\n", "needs usd_per_million_input_tokens"),
        ("usd_per_gpu_hour = -1\n", ">= 0"),
        ("usd_per_gpu_hour = 1\ngpus = 0\n", "whole number >= 1"),
        ("usd_per_gpu_hour = 1\nusd_per_node_hour = 9\n", "not both"),
        (
            "usd_per_gpu_hour = 1\nusd_per_million_input_tokens = 1\n"
            "usd_per_million_output_tokens = 1\n",
            "API vendor's",
        ),
        ("usd_per_token = 1\n", "unknown price keys"),
        ("gpus = 2\n", "gpus needs usd_per_gpu_hour"),
        ("usd_per_gpu_hour = 'two'\n", "number of dollars"),
        ("[endpoints\n", "not valid TOML"),
    ],
)
def test_bad_pricing_files_name_the_problem(tmp_path: Path, text: str, says: str) -> None:
    f = tmp_path / "p.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=says) as info:
        load_pricing(f)
    assert str(f) in str(info.value)


def test_bad_price_flags() -> None:
    with pytest.raises(ConfigError, match="KEY one of input"):
        parse_price_flags(["dollars=1"])
    with pytest.raises(ConfigError, match="must be a number"):
        parse_price_flags(["output=cheap"])
    assert np.isclose(
        parse_price_flags(["vendor:output=1e-1"])["vendor"]["usd_per_million_output_tokens"], 0.1
    )


def test_a_scenario_file_holds_price_tables(tmp_path: Path) -> None:
    from loadlab.scenario import load_scenario

    f = tmp_path / "s.toml"
    f.write_text('rate_rps = 1.0\nrequests = 2\n[pricing."*"]\nusd_per_gpu_hour = 2.5\ngpus = 2\n')
    assert load_scenario(f).pricing == {"*": {"usd_per_gpu_hour": 2.5, "gpus": 2}}
    f.write_text('rate_rps = 1.0\nrequests = 2\n[pricing."*"]\nusd_per_gpu_hour = -2.5\n')
    with pytest.raises(ValueError, match=">= 0"):
        load_scenario(f)
