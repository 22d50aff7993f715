"""The lab report's layout: every section, in Markdown and HTML, escaped (no server)."""

from __future__ import annotations

from loadlab._lab.render import render_html, render_markdown, sections
from tests.helpers.lab import summary_of, two_streams


def test_report_has_every_section_and_escapes() -> None:
    r = two_streams()
    quiet = {"others_cores": 0.0, "own_cores": 1.0, "steal_share": 0.0}
    busy = {"others_cores": 1.5, "own_cores": 0.5, "steal_share": 0.0}
    batching = {
        "preset": "tiny",
        "device": "cpu",
        "dtype": "float32",
        "torch_threads": 1,
        "decode_context": 64,
        "prefill_prompt": 64,
        "step_bytes": {"decode": {"1": 2e8, "4": 2.1e8}},  # none for prefill: shown as "-"
        "rounds": [  # decode: 10 and 38 tok/s (3.8x); prefill 1 x 64 / 0.64 s and 4 x 64 / 2.56 s
            {"decode_step_s": {"1": 0.1, "4": 4 / 38}, "prefill_step_s": {"1": 0.64, "4": 2.56},
             "machine": quiet},
            {"decode_step_s": {"1": 0.1, "4": 4 / 38}, "prefill_step_s": {"1": 0.64, "4": 2.56},
             "machine": busy},
        ],
    }  # fmt: skip
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
        "The lesson's claims on this machine",
        "The machine during each measurement",
        "Batching",
        "Static against continuous",
        "Why the useful rows and the requests/s differ",
        "Interference",
        "long prompt's own TTFT",
        "What disaggregation costs",
        "Modes not run",
    ):
        assert f"## {title}" in md or title in md
    assert "*Supports: decode is memory-bandwidth-bound" in md
    # the same in both rounds: no spread; round 2 was busy, and says so
    # bytes read: 0.21 GB in 4 / 38 s
    assert (
        "| decode | 4 | 38.0 [busy 1/2] | 3.80x [busy 1/2] | 105.26 [busy 1/2] | 2.0 [busy 1/2] |"
        in md
    )
    assert "| prefill | 4 | 100.0 [busy 1/2] | 1.00x [busy 1/2] | 2,560.00 [busy 1/2] | - |" in md
    assert "| 640 |" in md  # KV bytes from the server counter
    assert "step-cost curve: decode step at batch 4 (ms, x batch 1) | 105.3 (1.05x)" in md
    page = render_html(summary)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert page.count("<table>") == len(sections(summary)) == md.count("\n| --- |")
