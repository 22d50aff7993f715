"""The max-load-under-SLO sweep: rising load levels, then bisection, and the curve's knee.

``find_max_load`` is pure: it asks an ``evaluate(load) -> Level`` callable for each level in
rising order until one fails, then bisects between the last pass and the first fail
(``bisect_steps`` times, or until the gap is one unit for concurrencies). ``run_level`` is the
real evaluator: one ``loadlab run`` at that load (``loadlab._runner.run.run_prepared``) judged by
``loadlab._slo.evaluate``. The knee of the latency-throughput curve is found with Kneedle
(Satopää et al. 2011, "Finding a 'Kneedle' in a Haystack"): on the curve normalised to the unit
square, the point farthest below the diagonal.

Example::

    result = find_max_load(lambda x: Level(x, passed=x <= 5), [1, 2, 4, 8], bisect_steps=3)
    result.max_passing_load      # 5.0 (4 passed, 8 failed; bisection: 6 fail, 5 pass, 5.5 fail)
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadlab.errors import ConfigError
from loadlab.records import pick

if TYPE_CHECKING:
    from loadlab._runner.run import Prepared
    from loadlab._slo import SLOSpec
    from loadlab.config import RunConfig
    from loadlab.results import Results

__all__ = [
    "Level",
    "SweepResult",
    "ceilings_only",
    "find_max_load",
    "floors_line",
    "judge_floors",
    "judge_level",
    "knee",
    "level_config",
    "level_seed",
    "render_html",
    "run_level",
]

MODES = ("rate", "concurrency")


@dataclass(frozen=True)
class Level:
    """One load level and what it did."""

    load: float
    passed: bool
    exit_code: int = 0  # the SLO verdict's: 0 pass, 1 fail, 2 not valid evidence
    phase: str = "coarse"  # "coarse" | "bisect"
    throughput_rps: float = 0.0  # requests completed ok per second
    sent_rps: float = 0.0  # requests sent per second: the request rate the level achieved
    output_tokens_per_s: float = 0.0
    ttft_p95_ms: float | None = None
    e2e_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    error_rate: float = 0.0
    path: str | None = None  # this level's results file
    failed_objectives: tuple[str, ...] = ()
    # not passed for want of evidence, not for a measured miss: too few requests, or an
    # objective whose interval straddles its threshold (more requests decide it)
    inconclusive: bool = False
    undecided: tuple[str, ...] = ()  # then: what lacked evidence ("min_requests", objectives)
    more_requests: int | None = None  # then: about how many more requests would decide it
    # at the run's prices and from its GPU power (docs/cost.md); None: none given
    usd_per_million_output_tokens: float | None = None
    usd_per_1k_requests: float | None = None
    usd_per_session: float | None = None
    joules_per_output_token: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__, failed_objectives=list(self.failed_objectives),
                    undecided=list(self.undecided))  # fmt: skip


@dataclass
class SweepResult:
    mode: str  # "rate" | "concurrency"
    levels: list[Level] = field(default_factory=list)  # in the order they ran
    # what a load level counts: "requests/s" or "sessions/s" (a chat workload's rate starts
    # sessions, each several requests) by rate, "streams" by concurrency; "" = from the mode
    load_unit: str = ""
    max_passing_load: float | None = None
    first_failing_load: float | None = None
    knee_load: float | None = None
    note: str = ""
    # the SLO's floors, set aside by the search (``ceilings_only``), and how the highest
    # passing level did on them: lines to print
    floors: list[str] = field(default_factory=list)

    def curve(self) -> list[Level]:
        """Every level, by load (a bisected load measured twice keeps the later run)."""
        by_load = {lv.load: lv for lv in self.levels}
        return [by_load[k] for k in sorted(by_load)]

    @property
    def unit(self) -> str:
        return self.load_unit or ("requests/s" if self.mode == "rate" else "streams")

    def _with_rate(self, load: float | None) -> str:
        """``88 sessions/s (148 requests/s sent)``: a load in its unit, the request rate beside."""
        lv = next((x for x in reversed(self.levels) if x.load == load), None)
        text = f"{_num(load)} {self.unit}"
        if lv is not None and self.unit != "requests/s":
            text += f" ({lv.sent_rps:.3g} requests/s sent)"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "loadlab._runner.sweep",
            "version": 1,
            "mode": self.mode,
            "load_unit": self.unit,
            **pick(self, "max_passing_load first_failing_load knee_load note floors"),
            "levels": [lv.to_dict() for lv in self.levels],
        }

    def to_text(self) -> str:
        unit = self.unit
        head = (f"{'load':>9} {'verdict':<8}{'sent/s':>8}{'req/s':>8}{'tok/s':>9}{'ttft p95':>10}"
                f"{'e2e p95':>10}{'tpot p95':>10}{'errors':>8}")  # fmt: skip
        lines = [
            f"sweep by {self.mode}: load in {unit}; sent/s = requests sent per second, "
            "req/s = completed ok per second; latencies in ms",
            head,
            "-" * len(head),
        ]
        if unit == "sessions/s":
            lines.insert(1, "(each chat session sends several requests: sent/s exceeds the load)")
        for lv in self.curve():
            verdict = "PASS" if lv.passed else ("INVALID" if lv.exit_code == 2 else "FAIL")
            mark = "  <- knee" if lv.load == self.knee_load else ""
            lines.append(
                f"{_num(lv.load):>9} {verdict:<8}{lv.sent_rps:>8.2f}{lv.throughput_rps:>8.2f}"
                f"{lv.output_tokens_per_s:>9.1f}{_ms(lv.ttft_p95_ms):>10}{_ms(lv.e2e_p95_ms):>10}"
                f"{_ms(lv.tpot_p95_ms):>10}{lv.error_rate:>8.1%}{mark}"
            )
        if self.max_passing_load is None:
            lowest = self.curve()[0].load
            lines.append(f"no level met the SLOs (lowest tried: {self._with_rate(lowest)})")
        else:
            nxt = (f", next step {self._with_rate(self.first_failing_load)} fails"
                   if self.first_failing_load is not None else "")  # fmt: skip
            lines.append(
                f"highest load meeting the SLOs: {self._with_rate(self.max_passing_load)}{nxt}"
            )
        lines += self._cost_lines()
        if self.knee_load is not None:
            lines.append(f"knee: {self._with_rate(self.knee_load)}")
        if self.note:
            lines.append(f"note: {self.note}")
        lines.extend(self.floors)
        return "\n".join(lines)

    def _cost_lines(self) -> list[str]:
        """Each level's price per million output tokens, and the cost at the SLO-max load."""
        priced = [lv for lv in self.curve() if lv.usd_per_million_output_tokens is not None]
        if not priced:
            return []
        from loadlab._report.cost import usd

        out = ["$ per million output tokens by load: " + ", ".join(
            f"{_num(lv.load)}: {usd(lv.usd_per_million_output_tokens)}" for lv in priced)]  # fmt: skip
        best = next((lv for lv in reversed(self.levels) if lv.load == self.max_passing_load), None)
        if best is not None and best.usd_per_million_output_tokens is not None:
            energy = (f", {best.joules_per_output_token:.3g} J per output token"
                      if best.joules_per_output_token is not None else "")  # fmt: skip
            out.append(
                f"cost at the SLO-max load ({self._with_rate(best.load)}): "
                f"{usd(best.usd_per_million_output_tokens)} per million output tokens, "
                f"{usd(best.usd_per_1k_requests)} per 1,000 requests, "
                f"{usd(best.usd_per_session)} per session{energy}"
            )
        return out


def _num(x: float | None) -> str:
    return "-" if x is None else (f"{x:g}" if x == int(x) else f"{x:.3g}")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def find_max_load(
    evaluate: Callable[[float], Level],
    levels: Sequence[float],
    bisect_steps: int = 3,
    integer: bool = False,
    mode: str = "rate",
    load_unit: str = "",
) -> SweepResult:
    """Coarse pass over ``levels`` (rising) until the first fail, then bisect."""
    if not levels or any(b <= a for a, b in itertools.pairwise(levels)):
        raise ConfigError(f"load levels must be given and strictly rising, got {list(levels)}")
    if levels[0] <= 0:
        raise ConfigError(f"load levels must be > 0, got {levels[0]}")
    result = SweepResult(mode=mode, load_unit=load_unit)
    lo: float | None = None
    hi: float | None = None
    for load in levels:
        lv = evaluate(load)
        result.levels.append(lv)
        if not lv.passed:
            hi = load
            break
        lo = load
    stopped = result.levels[-1]
    if lo is None:
        result.first_failing_load = hi
        result.note = (_longer(stopped, "the lowest level") if stopped.inconclusive
                       else "the lowest level already fails: try lower loads")  # fmt: skip
        result.knee_load = knee(result.curve())
        return result
    if hi is None:
        result.max_passing_load = lo
        result.note = "every level passed: the limit is above the highest level tried"
        result.knee_load = knee(result.curve())
        return result
    if stopped.inconclusive:
        result.note = _longer(stopped, f"level {_num(stopped.load)}") + (
            " (the limit found may be too low)"
        )
    for _ in range(bisect_steps):
        mid = (lo + hi) // 2 if integer else (lo + hi) / 2
        if integer and (mid <= lo or mid >= hi):
            break  # adjacent integers: nothing left between them
        lv = evaluate(mid)
        result.levels.append(_as_bisect(lv))
        if lv.passed:
            lo = mid
        else:
            hi = mid
    result.max_passing_load, result.first_failing_load = lo, hi
    result.knee_load = knee(result.curve())
    return result


def _longer(lv: Level, which: str) -> str:
    """What to change when a level did not pass for want of evidence: more requests per
    level (a longer level), not a lower load, which sends fewer."""
    what = ", ".join(lv.undecided) or "its objectives"
    need = ""
    if lv.more_requests:
        need = f"; it needs about {lv.more_requests:,} more requests"
        if lv.sent_rps > 0:
            need += f", at {lv.sent_rps:.3g} requests/s about {lv.more_requests / lv.sent_rps:.0f} s more"
    return (f"{which} was not conclusive ({what}){need}: make each level longer (--duration) "
            "or send more requests per level; a lower load would not help")  # fmt: skip


def _as_bisect(lv: Level) -> Level:
    return Level(**{**lv.__dict__, "phase": "bisect"})


def knee(curve: Sequence[Level]) -> float | None:
    """The load at the knee of latency (e2e p95) against throughput (Kneedle, convex rising).

    Normalise throughput x and latency y to [0, 1] over the curve; the knee is the level
    with the largest x - y: where throughput has mostly been gained and latency not yet.
    None with fewer than three usable points.
    """
    pts = [(lv.load, lv.output_tokens_per_s, lv.e2e_p95_ms) for lv in curve]
    pts = [p for p in pts if p[2] is not None]
    if len(pts) < 3:
        return None
    xs = [p[1] for p in pts]
    ys = [float(p[2]) for p in pts if p[2] is not None]
    x_span, y_span = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    scores = [
        ((x - min(xs)) / x_span) - ((y - min(ys)) / y_span) for x, y in zip(xs, ys, strict=True)
    ]
    best = max(range(len(pts)), key=lambda i: scores[i])
    return pts[best][0]


def run_level(
    base: RunConfig,
    prepared: Prepared,
    spec: SLOSpec,
    load: float,
    mode: str,
    out_dir: Path,
    inconclusive: str = "fail",
) -> Level:
    """One real level: run the load against the endpoint ``prepared`` once for every level,
    write its results file, judge it against ``spec``."""
    from loadlab._runner.run import run_prepared
    from loadlab.results import write_results

    cfg = level_config(base, load, mode)
    path = out_dir / f"level-{mode}-{_num(load)}.json"
    cfg = cfg.replace(out=str(path), slo=None, progress=False)
    results = run_prepared(cfg, prepared)
    write_results(results, path)
    return judge_level(results, spec, load, str(path), inconclusive)


def level_config(base: RunConfig, load: float, mode: str) -> RunConfig:
    """``base`` at one load: open loop at ``load`` req/s, or closed loop of ``load`` streams,
    with the level's own seed (``level_seed``)."""
    seed = level_seed(base.seed, load)
    if mode == "rate":
        return base.replace(rate_rps=float(load), concurrency=None, seed=seed)
    return base.replace(concurrency=int(load), rate_rps=None, seed=seed)


def level_seed(seed: int | None, load: float) -> int:
    """The seed of the level at ``load`` in a sweep seeded ``seed``: its own for each level.

    With one seed for every level, each level's prompts would begin with the previous level's
    (the same seeded text, one more request per second), and a server with a prefix cache
    (the reference server's, vLLM's automatic prefix caching, SGLang's radix cache) would
    serve every level after the first from its cache: a sweep of 64-token prompts on the
    reference server found 48 of 64 tokens cached in every request of its later levels and
    an SLO-max load of 18-22 requests/s in each of its four modes, where levels that start
    cold carry 8-12 (disaggregated: 13-20). Reproducible: the same sweep seed and load give
    the same level. (A dataset or trace replay sends the same texts whatever the seed: its
    later levels meet a warm cache all the same.)"""
    key = f"sweep {seed or 0} {float(load)!r}"  # unseeded (a prediction): seed 0's levels
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # within --seed's range, 0 .. 2**63 - 1


def judge_level(
    results: Results, spec: SLOSpec, load: float, path: str | None, inconclusive: str = "fail"
) -> Level:
    """A level from its results (measured or predicted) judged against ``spec``."""
    from loadlab._analysis.cost import cost_of
    from loadlab._analysis.summary import summarize
    from loadlab._analysis.telemetry import energy_of
    from loadlab._report.text import objective_line
    from loadlab._slo import evaluate

    verdict = evaluate(results, spec, inconclusive="pass" if inconclusive == "pass" else "fail")
    missed = any(r.status == "fail" for r in verdict.rows)
    short = max(0, spec.min_requests - (verdict.counts.sent if verdict.counts else 0))
    undecided = [str(r.objective) for r in verdict.rows if r.status == "inconclusive"]
    undecided += ["min_requests"] if short else []
    more = [r.extra_requests for r in verdict.rows if r.extra_requests] + ([short] if short else [])
    s = summarize(results)
    bill, energy = cost_of(results), energy_of(results)
    counts = s.counts
    lo, hi = s.window_ns
    sent = sum(1 for r in results.records if r.sent_ns is not None and lo <= r.sent_ns <= hi)
    return Level(
        load=float(load),
        passed=verdict.exit_code == 0,
        exit_code=int(verdict.exit_code),
        throughput_rps=s.throughput.requests_per_s,
        sent_rps=sent / s.throughput.window_s,
        output_tokens_per_s=s.throughput.output_tokens_per_s,
        ttft_p95_ms=s.ttft_ms.at(95),
        e2e_p95_ms=s.e2e_ms.at(95),
        tpot_p95_ms=s.tpot_ms.at(95),
        error_rate=counts.error_rate,
        path=path,
        failed_objectives=tuple(
            [objective_line(r) for r in verdict.failed_rows()] + list(verdict.invalid_reasons)
        ),
        inconclusive=verdict.exit_code != 0 and not missed and not results.saturated,
        undecided=tuple(undecided),
        more_requests=max(more) if more else None,
        usd_per_million_output_tokens=bill.usd_per_million_output_tokens if bill else None,
        usd_per_1k_requests=bill.usd_per_1k_requests if bill else None,
        usd_per_session=bill.usd_per_session if bill else None,
        joules_per_output_token=energy.joules_per_output_token if energy is not None else None,
    )


def ceilings_only(spec: SLOSpec) -> tuple[SLOSpec, list[str]]:
    """The SLO without its floors (``output_tokens_per_s >= 1000``, ``goodput_rps >= 4``):
    a search for the highest load that meets the SLO cannot use objectives that a low load
    fails by design (one stream never makes 1,000 tokens/s). Returns the ceilings and the
    floors' text (``floors_line``)."""
    import dataclasses

    floors = [str(o) for o in spec.objectives if not o.upper_bound]
    keep = tuple(o for o in spec.objectives if o.upper_bound)
    if not keep:
        raise ConfigError(f"{spec.source or 'the SLO'} has no upper-bound objective to search on")
    return dataclasses.replace(spec, objectives=keep), floors


def floors_line(floors: Sequence[str]) -> str:
    """The line a search prints about the floors ``ceilings_only`` set aside."""
    return "not searched on (floors fail at low load by design): " + ", ".join(floors)


def judge_floors(result: SweepResult, spec: SLOSpec) -> list[str]:
    """``floors_line`` for ``spec``'s floors, then how the highest passing level (its results
    file) did on each: whether the endpoint reaches them at the load the ceilings allow."""
    import dataclasses

    from loadlab._report.text import objective_line
    from loadlab._slo import evaluate
    from loadlab.results import read_results

    floors = tuple(o for o in spec.objectives if not o.upper_bound)
    if not floors:
        return []
    lines = [floors_line([str(o) for o in floors])]
    best = next((lv for lv in reversed(result.levels)
                 if lv.load == result.max_passing_load and lv.path), None)  # fmt: skip
    if best is None or best.path is None:
        return lines
    verdict = evaluate(read_results(best.path), dataclasses.replace(spec, objectives=floors))
    at = result._with_rate(best.load)
    lines += [f"  at {at}: {'met' if r.status == 'pass' else 'NOT met'}: {objective_line(r)}"
              for r in verdict.rows]  # fmt: skip
    return lines


def _threshold_lines(spec: SLOSpec | None) -> dict[str, list[tuple[float, str]]]:
    """The SLO's ceilings on the plotted metrics: ``{metric: [(threshold, objective text)]}``."""
    out: dict[str, list[tuple[float, str]]] = {"ttft_ms": [], "e2e_ms": []}
    for o in spec.objectives if spec is not None else ():
        if o.metric in out and o.upper_bound and o.request_class is None:
            out[o.metric].append((o.threshold, str(o)))
    return out


def _plot(result: SweepResult, lines: dict[str, list[tuple[float, str]]]) -> str:
    """The two panels as an SVG data URI, text drawn as outlines (as ``loadlab._report.plots``
    does), so nothing from a run reaches the page as markup."""
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    curve = result.curve()
    fig = Figure(figsize=(9, 3.4))
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.9, wspace=0.25)
    ax, ax2 = fig.subplots(1, 2)
    x = [lv.output_tokens_per_s for lv in curve]
    for key, label, color in (("e2e_p95_ms", "E2E p95", "tab:blue"),
                              ("ttft_p95_ms", "TTFT p95", "tab:orange")):  # fmt: skip
        ys = [getattr(lv, key) for lv in curve]
        ax.plot(x, [float("nan") if y is None else y for y in ys], "o-", label=label, c=color)
        for threshold, text in lines[key.replace("_p95", "")]:
            ax.axhline(threshold, ls="--", lw=1, c=color)
            ax.annotate(text, (0.01, threshold), xycoords=("axes fraction", "data"), fontsize=7,
                        color=color, textcoords="offset points", xytext=(0, 2))  # fmt: skip
    for lv in curve:
        if lv.e2e_p95_ms is not None:
            color = "tab:green" if lv.passed else "tab:red"
            ax.annotate(_num(lv.load), (lv.output_tokens_per_s, lv.e2e_p95_ms), color=color,
                        textcoords="offset points", xytext=(3, 4), fontsize=8)  # fmt: skip
        if lv.load == result.knee_load and lv.e2e_p95_ms is not None:
            ax.plot([lv.output_tokens_per_s], [lv.e2e_p95_ms], "s", ms=11, mfc="none", c="k")
    ax.set(xlabel="output tokens/s", ylabel="ms", title="latency vs throughput (knee: square)")
    ax.legend(loc="upper left")
    ax2.plot([lv.load for lv in curve], x, "o-")
    ax2.set(xlabel=f"{result.mode} ({result.unit})", ylabel="output tokens/s",
            title="throughput vs load")  # fmt: skip
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "loadlab",
                                "text.parse_math": False}):  # fmt: skip
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def render_html(result: SweepResult, spec: SLOSpec | None = None) -> str:
    """A standalone page in the report's style: the answer, the latency-throughput curve
    (knee marked, the SLO's TTFT and E2E thresholds as dashed lines), the levels and the
    printed text. Every string is escaped by the report's templates."""
    from loadlab._report.html import render_template

    lines = _threshold_lines(spec)
    levels = []
    for lv in result.curve():
        verdict = "PASS" if lv.passed else ("INVALID" if lv.exit_code == 2 else "FAIL")
        css = {"PASS": "pass", "FAIL": "fail"}.get(verdict, "inconclusive")
        levels.append({**lv.__dict__, "verdict": verdict, "css": css, "load": _num(lv.load),
                       "knee": lv.load == result.knee_load,
                       "why": "; ".join(lv.failed_objectives)})  # fmt: skip
    answer = ""
    if result.max_passing_load is not None:
        answer = f"Highest load meeting the SLOs: {result._with_rate(result.max_passing_load)}"
    return render_template(
        "sweep.html.j2",
        mode=result.mode,
        unit=result.unit,
        slo=(spec.name or spec.source) if spec is not None else "",
        answer=answer,
        note=result.note,
        plot=_plot(result, lines),
        thresholds=[text for pairs in lines.values() for _, text in pairs],
        levels=levels,
        text=result.to_text(),
    )
