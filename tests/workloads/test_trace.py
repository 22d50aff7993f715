"""Trace loaders: Azure 2023 quirks on the real file, Azure 2024, Mooncake, BurstGPT, bad input."""

from __future__ import annotations

import itertools

import pytest

from loadlab.workloads._params import TRACES
from loadlab.workloads._trace import (
    TraceError,
    TraceStats,
    detect_format,
    iter_trace,
    parse_timestamp,
)

AZURE_2024 = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2024-05-10 00:00:00+00:00,1200,30\n"
    "2024-05-10 00:00:00.25+00:00,800,5\n"
    "2024-05-10 00:00:02.123456+00:00,64,0\n"
    "2024-05-10 01:00:00+01:00,10,10\n"  # the same instant as the first row, written at +01:00
)

BURSTGPT = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "45,ChatGPT,1087,0,1087,Conversation log\n"  # failed request: skipped, counted
    "118,GPT-4,417,276,693,API log\n"
    "151.5,ChatGPT,1360,356,1716,API log\n"
)


def write(tmp_path, name, text, newline="\n"):
    p = tmp_path / name
    p.write_bytes(text.replace("\n", newline).encode())
    return p


def test_azure_2023_real_file_crlf_no_final_newline_seven_digits():
    path = TRACES["azure-2023-conv"]
    raw = path.read_bytes()
    assert b"\r\n" in raw[:100] and not raw.endswith(b"\n")  # the quirks are really there
    stats = TraceStats()
    rows = list(iter_trace(path, stats=stats))
    assert stats.format == "azure-2023" and stats.rows_read == len(rows) == 19366
    assert (rows[0].t_s, rows[0].prompt_tokens, rows[0].output_tokens) == (0.0, 374, 44)
    # 18:15:50.9951690 - 18:15:46.6805900, all seven digits kept
    assert rows[1].t_s == pytest.approx(4.3145790, abs=1e-9)
    assert (rows[-1].prompt_tokens, rows[-1].output_tokens, rows[-1].line) == (197, 183, 19367)
    assert rows[-1].t_s == pytest.approx(3501.721937, abs=1e-6)


def test_timestamp_forms():
    assert parse_timestamp("1970-01-01 00:00:01.5000000") == 1.5
    assert parse_timestamp("1970-01-01 00:00:01") == 1.0
    assert parse_timestamp("1970-01-01 01:00:00+01:00") == 0.0
    assert parse_timestamp("1970-01-01T00:00:02.25Z") == 2.25
    with pytest.raises(ValueError, match="not a timestamp"):
        parse_timestamp("16/11/2023 18:15")


def test_azure_2024_offsets_and_optional_fractions(tmp_path):
    stats = TraceStats()
    rows = list(iter_trace(write(tmp_path, "w.csv", AZURE_2024), stats=stats))
    assert stats.format == "azure-2024"
    assert [r.t_s for r in rows[:3]] == [0.0, 0.25, 2.123456]
    assert rows[3].t_s == 2.123456 and stats.out_of_order == 1  # earlier: sent at its turn
    assert rows[2].output_tokens == 0  # kept here; the replay sends 1 and counts it


def test_mooncake_real_file_ms_and_hash_ids(shared_data):
    path = shared_data / "traces" / "mooncake_synthetic_trace.jsonl"
    assert detect_format(path) == "mooncake"
    rows = list(itertools.islice(iter_trace(path), 50))
    assert rows[0].t_s == 0.0 and all(r.hash_ids for r in rows)
    assert all(b.t_s >= a.t_s for a, b in itertools.pairwise(rows))


def test_burstgpt_failed_rows_and_model_filter(tmp_path):
    path = write(tmp_path, "b.csv", BURSTGPT)
    stats = TraceStats()
    rows = list(iter_trace(path, stats=stats))
    assert stats.format == "burstgpt" and stats.failed_rows == 1
    assert [(r.t_s, r.prompt_tokens, r.output_tokens, r.model) for r in rows] == [
        (0.0, 472, 18, "ChatGPT"),
        (113.0, 417, 276, "GPT-4"),
        (146.5, 1360, 356, "ChatGPT"),
    ]
    stats = TraceStats()
    only = list(iter_trace(path, stats=stats, model="ChatGPT", log_type="API log"))
    assert [r.line for r in only] == [5] and stats.filtered_out == 3 and stats.failed_rows == 0
    with pytest.raises(TraceError, match="BurstGPT traces only"):
        list(iter_trace(write(tmp_path, "a.csv", AZURE_2024), model="ChatGPT"))


def test_window_in_trace_time(tmp_path):
    rows = list(iter_trace(write(tmp_path, "b.csv", BURSTGPT), start_s=100, duration_s=40))
    assert [r.line for r in rows] == [4]


def test_malformed_line_names_file_and_line(tmp_path):
    bad = AZURE_2024.replace("800,5", "800,five")
    path = write(tmp_path, "bad.csv", bad, newline="\r\n")
    with pytest.raises(TraceError) as info:
        list(iter_trace(path))
    msg = str(info.value)
    assert f"{path}:3:" in msg and "GeneratedTokens" in msg and "skip_bad_lines" in msg


def test_skip_bad_lines_counts_them(tmp_path):
    text = BURSTGPT + "oops\n9999,ChatGPT,1,2\n"
    stats = TraceStats()
    rows = list(iter_trace(write(tmp_path, "b.csv", text), stats=stats, skip_bad_lines=True))
    assert len(rows) == 3 and stats.bad_lines == 2 and stats.bad_line_numbers == [6, 7]


def test_bad_json_line_in_mooncake(tmp_path):
    text = '{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 3,\n'
    with pytest.raises(TraceError, match=r"m.jsonl:2: malformed mooncake line \(not valid JSON"):
        list(iter_trace(write(tmp_path, "m.jsonl", text)))


def test_rows_are_streamed_not_loaded(tmp_path):
    # a bad line far down the file does not stop the first rows from coming out
    text = AZURE_2024 + "garbage\n" * 3
    first = next(iter(iter_trace(write(tmp_path, "s.csv", text))))
    assert first.prompt_tokens == 1200


def test_unknown_format_is_named(tmp_path):
    path = write(tmp_path, "x.csv", "time,prompt,completion\n1,2,3\n")
    with pytest.raises(TraceError, match="unknown trace format") as info:
        detect_format(path)
    assert "'time,prompt,completion'" in str(info.value) and "Azure" in str(info.value)
    with pytest.raises(TraceError, match="not found"):
        detect_format(tmp_path / "missing.csv")
