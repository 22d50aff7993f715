"""The HTML report: hostile strings from a results file stay text, and the page opens in
headless Chromium without console errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from loadlab.cli import main
from loadlab.results import Results, write_results
from tests.helpers.synth import make_results

EVIL = "</script><img src=x onerror=alert(1)>\u2028{{7*7}}"
ARTIFACTS = Path(
    os.environ.get("LOADLAB_TEST_ARTIFACTS", Path(tempfile.gettempdir()) / "loadlab-test-artifacts")
)
ALLOWED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "div", "table", "tr",
    "th", "td", "img", "em", "strong", "pre",
}  # fmt: skip


def evil_results() -> Results:
    """Every string a results file carries into the report holds the hostile payload."""
    res = make_results(60, seed=1, failures=4, open_loop=True, request_class=EVIL)
    for r in res.records:
        r.endpoint = EVIL
        r.finish_reason = EVIL
        if r.failed:
            r.error = f"stream error: {EVIL}"
            r.request_id = EVIL
    res.config = {
        "workload": {"kind": "chat", "prompt": EVIL, "system_prompt": EVIL},
        "endpoints": [{"name": EVIL, "url": "http://127.0.0.1:1/v1", "headers": {EVIL: EVIL}}],
        EVIL: EVIL,
    }
    res.environment = {"host": EVIL, "platform": EVIL}
    res.started_at = EVIL
    res.kind = EVIL
    res.generator = {"saturated": False, "note": EVIL}
    res.server_samples = [
        {"t_ns": i * 250_000_000, "metrics": {"vllm:num_requests_waiting": i % 4, EVIL: 1.0}}
        for i in range(12)
    ]
    return res


@pytest.fixture(scope="module")
def evil_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rendered once, through the command a user types: loadlab report --html --slo."""
    folder = tmp_path_factory.mktemp("html")
    results = write_results(evil_results(), folder / "run.json")
    slo = folder / "slo.toml"
    slo.write_text(
        f"name = {json.dumps(EVIL)}\nmin_requests = 1\nobjectives = ['ttft_ms.p50 <= 1000']\n"
    )
    path = folder / "report.html"
    assert main(["report", str(results), "--html", str(path), "--slo", str(slo)]) == 0
    return path


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs += attrs


def test_hostile_strings_are_escaped(evil_html: Path) -> None:
    html = evil_html.read_text(encoding="utf-8")
    for raw in (
        "<img src=x",
        "</script><img",
        "\u2028",
        "{{",
        "7*7}}",
        "<script",
        "onerror=alert(1)>",
    ):
        assert raw not in html, raw
    # ... and they are on the page, as text: config, error strings, SLO name, environment.
    shown = "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;&#8232;&#123;&#123;7*7&#125;&#125;"
    assert html.count(shown) >= 6
    # the error column: a server's text, whose U+2028 is escaped as a terminal would need
    error_text = shown.replace("&#8232;", "\\u2028")
    assert f"stream error: {error_text}" in html
    parser = _Tags()
    parser.feed(html)
    assert parser.tags <= ALLOWED_TAGS, parser.tags - ALLOWED_TAGS
    assert not [a for a, _ in parser.attrs if a.startswith("on")]
    srcs = [v for a, v in parser.attrs if a == "src"]
    assert srcs and all(v and v.startswith("data:image/svg+xml;base64,") for v in srcs)
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    for section in ("SLO verdict", "Latency distributions", "The server's side", "Timeline"):
        assert section in html, section


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name) or (
            f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None
        )
        if found:
            return found
    return None


def _chrome_args(binary: str, profile: Path) -> list[str]:
    return [
        binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
    ]  # fmt: skip


def test_report_opens_in_headless_chromium(evil_html: Path, tmp_path: Path) -> None:
    binary = _chromium()
    if binary is None:
        pytest.skip("chromium is not installed (scripts/test.sh installs it with apt-get)")
    args = _chrome_args(binary, tmp_path / "profile")
    proc = subprocess.run(
        [*args, "--dump-dom", evil_html.as_uri()], capture_output=True, text=True, timeout=120
    )
    console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    problems = []
    if proc.returncode != 0:
        problems.append(f"chromium exited {proc.returncode}")
    if console:
        problems.append("console messages: " + " | ".join(console[:5]))
    dom = proc.stdout
    if "<h1>loadlab report</h1>" not in dom:
        problems.append("the page did not render (no heading in the DOM)")
    if '<img src="x"' in dom or "onerror" in dom.replace("onerror=alert(1)&gt;", ""):
        problems.append("an injected element reached the DOM")
    if problems:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "report-chromium.png"
        subprocess.run(
            [*args, "--window-size=1200,3000", f"--screenshot={shot}", evil_html.as_uri()],
            capture_output=True,
            timeout=120,
        )
        shutil.copy(evil_html, ARTIFACTS / "report.html")
        (ARTIFACTS / "chromium-stderr.log").write_text(proc.stderr)
        pytest.fail(f"{'; '.join(problems)} (screenshot and log in {ARTIFACTS})")


def test_report_command_text_slo_and_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    res = make_results(40, seed=2, failures=2)
    res.records[0].error = '=HYPERLINK("http://x")'
    path = write_results(res, tmp_path / "run.json")
    slo = tmp_path / "slo.toml"
    slo.write_text('min_requests = 1\nobjectives = ["ttft_ms.p50 <= 1000"]')
    code = main(["report", str(path), "--csv", str(tmp_path / "r.csv"), "--slo", str(slo)])
    assert code == 0
    out = capsys.readouterr().out
    assert "TTFT (ms)" in out and "verdict: PASS" in out
    csv = (tmp_path / "r.csv").read_text()
    assert "'=HYPERLINK" in csv  # a spreadsheet will not run it as a formula


def test_comparison_page_escapes_labels() -> None:
    from loadlab._analysis.compare import compare
    from loadlab._report.html import render_comparison_html

    runs = [make_results(40, seed=1, tokens=4), make_results(40, seed=2, tokens=4)]
    cmp = compare(runs, ["base", EVIL], n_boot=100)
    html = render_comparison_html(cmp, runs, fail_on_regression_pct=10)
    for raw in ("<img src=x", "\u2028", "{{", "<script"):
        assert raw not in html, raw
    assert "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in html
    assert "No significant regression" in html


def test_log_axes_label_plain_numbers() -> None:
    """Mathtext is off (a "$" in a label stays a dollar sign), so log axes must not use the
    default "$10^{2}$" labels, which would be printed raw."""
    import numpy as np
    from matplotlib.figure import Figure

    from loadlab._report import plots

    fig = Figure()
    ax = fig.subplots()
    plots._ecdf(ax, np.geomspace(1, 1000, 50))
    assert ax.get_xscale() == "log"
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels and not any("$" in t or "mathdefault" in t for t in labels), labels


def test_numbers_in_the_page_are_rounded_not_raw_floats() -> None:
    from loadlab._report.html import render_html

    res = make_results(20, seed=1)
    res.config = {"rate_rps": 2.9413063599999996, "shares": [0.1 + 0.2, 0.7], "requests": 500}
    res.environment = {"cpu_ghz": 3.0000000000000004}
    page = render_html(res)
    assert "2.9413063599999996" not in page and "0.30000000000000004" not in page
    assert ">2.94131<" in page and ">[0.3, 0.7]<" in page and ">500<" in page
    assert ">3.0<" in page
