"""The lab report's layout: every section, in Markdown and HTML, escaped (no server)."""

from __future__ import annotations

from loadlab.lab.render import render_html, render_markdown, sections
from tests.helpers.lab import summary_of, two_streams


def test_report_has_every_section_and_escapes() -> None:
    r = two_streams()
    batching = {
        "preset": "tiny",
        "device": "cpu",
        "dtype": "float32",
        "torch_threads": 1,
        "decode_context": 64,
        "prefill_prompt": 64,
        "decode_tokens_per_s": {"1": 10.0, "4": 38.0},
        "decode_speedup": {"1": 1.0, "4": 3.8},
        "prefill_tokens_per_s": {"1": 100.0, "4": 110.0},
        "prefill_speedup": {"1": 1.0, "4": 1.1},
    }
    summary = summary_of(
        {
            "continuous": {"interference": r, "baseline": r, "batch": r},
            "disaggregated": {"interference": r, "baseline": r, "batch": r},
        },
        unavailable={"static": "<script>alert(1)</script>"},
        batching=batching,
    )
    md = render_markdown(summary)
    for title in (
        "Batching",
        "Static against continuous",
        "Interference",
        "Baseline",
        "long prompt's own TTFT",
        "What disaggregation costs",
        "Acceptance",
        "Modes not run",
    ):
        assert f"## {title}" in md or title in md
    assert "*Supports: decode is memory-bandwidth-bound" in md
    assert "| decode | 4 | 38.0 | 3.80x |" in md
    assert "| 640 |" in md  # KV bytes from the server counter
    page = render_html(summary)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert page.count("<table>") == len(sections(summary)) == md.count("\n| --- |")
