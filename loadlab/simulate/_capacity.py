"""Capacity by simulation: the highest rate per replica that meets an SLO file, which objective
binds there, the replicas a peak rate needs, and what a million output tokens cost.

The last step of the sizing sequence (``loadlab._capacity.sizing``): besides "throughput binds"
and "memory binds", "the SLO binds", naming the objective. The search is the sweep's
(``loadlab._runner.sweep.find_max_load``: rising levels, then bisection), each level a simulated run
judged by ``loadlab._slo.evaluate``, so a predicted level passes or fails exactly as a measured
one with the same records would.

Example::

    plan = plan_capacity(cfg, server, model, load_slo("examples/slo.toml"), peak_rps=400,
                         gpus_per_replica=1, gpu_hour_price=2.5)
    print(plan.to_text())
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loadlab._runner.sweep import (
    Level,
    SweepResult,
    ceilings_only,
    find_max_load,
    floors_line,
    judge_level,
    level_config,
)
from loadlab.errors import ConfigError
from loadlab.records import pick
from loadlab.simulate._engine import Simulator

if TYPE_CHECKING:
    from loadlab._slo import SLOSpec
    from loadlab.config import RunConfig
    from loadlab.simulate._server import ServerConfig
    from loadlab.simulate._steptime import StepTimeModel

__all__ = [
    "SimCapacity",
    "add_capacity_arguments",
    "ceilings_only",
    "enough_requests",
    "plan_capacity",
    "predicted_sweep",
    "rate_levels",
    "run_capacity",
]


def rate_levels(first: float, last: float, count: int = 8) -> list[float]:
    """``count`` rising rates from ``first`` to ``last``, evenly spaced in log."""
    if not 0 < first < last or count < 2:
        raise ConfigError(f"need 0 < first < last and count >= 2, got {first}, {last}, {count}")
    ratio = (last / first) ** (1 / (count - 1))
    return [round(first * ratio**i, 4) for i in range(count)]


def predicted_sweep(
    base: RunConfig,
    server: ServerConfig,
    model: StepTimeModel,
    spec: SLOSpec,
    levels: Sequence[float],
    *,
    mode: str = "rate",
    bisect_steps: int = 4,
    inconclusive: str = "pass",
) -> tuple[SweepResult, dict[float, Any]]:
    """The sweep with every level simulated; also each level's predicted ``Results``.

    ``inconclusive="pass"`` (the default): a prediction can be made as long as wanted, so an
    objective it cannot yet decide at the SLO's confidence (0 errors in 150 requests against
    ``error_rate <= 0.01``) is not held against it; beside a measured sweep, use its policy."""
    from loadlab.workloads import build_requests

    runs: dict[float, Any] = {}

    def evaluate(load: float) -> Level:
        cfg = level_config(base, load, mode)  # no prompt sizing: no server counts a simulation
        cfg = enough_requests(cfg, spec.min_requests)
        results = Simulator(cfg, server, model).run(build_requests(cfg)).to_results()
        runs[float(load)] = results
        return judge_level(results, spec, load, None, inconclusive)

    result = find_max_load(evaluate, levels, bisect_steps, integer=mode != "rate", mode=mode)
    return result, runs


def enough_requests(cfg: RunConfig, least: int) -> RunConfig:
    """A simulated level that sends at least ``least`` requests (the SLO's ``min_requests``):
    an open-loop level whose rate x duration falls short sends exactly ``least`` at its rate
    instead, as long as that takes. A shorter one would be judged INVALID (too few requests)
    whatever its latencies, and the search would call every low rate a failure."""
    rate, duration = cfg.rate_rps, cfg.duration_s
    if rate is None or cfg.requests is not None or duration is None or rate * duration >= least:
        return cfg
    return cfg.replace(duration_s=None, requests=least)


@dataclass(frozen=True)
class SimCapacity:
    """What the simulated sweep says about one replica, and what a peak rate needs."""

    sweep: SweepResult
    binding_objective: str | None  # the objective that fails first above the SLO-max rate
    peak_rps: float | None = None
    gpus_per_replica: int = 1
    gpu_hour_price: float | None = None
    output_tokens_per_s: float = 0.0  # per replica, at the SLO-max rate
    notes: list[str] = field(default_factory=list)

    @property
    def max_rate_rps(self) -> float | None:
        return self.sweep.max_passing_load

    @property
    def replicas(self) -> int | None:
        if self.peak_rps is None or not self.max_rate_rps:
            return None
        return max(1, math.ceil(round(self.peak_rps / self.max_rate_rps, 9)))

    @property
    def gpus(self) -> int | None:
        return None if self.replicas is None else self.replicas * self.gpus_per_replica

    @property
    def cost_per_million_output_tokens(self) -> float | None:
        """GPU-hour price x GPUs per replica / output tokens per replica-hour, x 1e6."""
        if self.gpu_hour_price is None or not self.output_tokens_per_s:
            return None
        per_hour = self.output_tokens_per_s * 3600
        return self.gpu_hour_price * self.gpus_per_replica / per_hour * 1e6

    def to_text(self) -> str:
        lines = ["predicted sweep (simulated levels)", self.sweep.to_text()]
        if self.max_rate_rps is None:
            lines.append("=> no simulated rate met the SLOs: the SLO binds at any load")
            return "\n".join(lines + [f"   note: {n}" for n in self.notes])
        binds = f"the SLO binds: {self.binding_objective}" if self.binding_objective else (
            "no level failed: the limit is above the rates tried")  # fmt: skip
        lines.append(f"=> {self.max_rate_rps:g} req/s per replica "
                     f"({self.output_tokens_per_s:,.0f} output tokens/s); {binds}")  # fmt: skip
        if self.replicas is not None:
            lines.append(f"=> {self.replicas} replicas ({self.gpus} GPUs) for a peak of "
                         f"{self.peak_rps:g} req/s: ceil({self.peak_rps:g} / {self.max_rate_rps:g})"
                         f" x {self.gpus_per_replica} GPU{'s' if self.gpus_per_replica > 1 else ''}")  # fmt: skip
        cost = self.cost_per_million_output_tokens
        if cost is not None:
            lines.append(f"=> ${cost:,.3f} per million output tokens at ${self.gpu_hour_price:g} "
                         f"per GPU-hour (at the SLO-max rate)")  # fmt: skip
        return "\n".join(lines + [f"   note: {n}" for n in self.notes])

    def to_dict(self) -> dict[str, Any]:
        return pick(
            self,
            "max_rate_rps binding_objective peak_rps replicas gpus_per_replica gpus "
            "gpu_hour_price output_tokens_per_s cost_per_million_output_tokens sweep notes",
        )


def plan_capacity(
    base: RunConfig,
    server: ServerConfig,
    model: StepTimeModel,
    spec: SLOSpec,
    levels: Sequence[float],
    *,
    peak_rps: float | None = None,
    gpus_per_replica: int = 1,
    gpu_hour_price: float | None = None,
    bisect_steps: int = 4,
) -> SimCapacity:
    """The simulated sweep by rate, then replicas, GPUs and cost."""
    from loadlab._slo import evaluate

    sweep, runs = predicted_sweep(base, server, model, spec, levels, bisect_steps=bisect_steps)
    binding = None
    if sweep.first_failing_load is not None:
        verdict = evaluate(runs[float(sweep.first_failing_load)], spec, inconclusive="pass")
        binding = _most_violated(verdict)
    tokens_per_s = 0.0
    if sweep.max_passing_load is not None:
        by_load = {lv.load: lv for lv in sweep.levels}
        tokens_per_s = by_load[float(sweep.max_passing_load)].output_tokens_per_s
    return SimCapacity(sweep, binding, peak_rps, gpus_per_replica, gpu_hour_price, tokens_per_s,
                       [sweep.note] if sweep.note else [])  # fmt: skip


def _most_violated(verdict: Any) -> str | None:
    """The failing objective furthest past its threshold (relative), as text."""
    rows = verdict.failed_rows()
    if not rows:
        return "; ".join(verdict.invalid_reasons) or None

    def excess(r: Any) -> float:
        t = r.objective.threshold
        m = r.measured
        if m is None:
            return math.inf
        return -(r.margin or 0.0) / abs(t) if t else math.inf

    worst = max(rows, key=excess)
    measured = "-" if worst.measured is None else f"{worst.measured:.4g}"
    return f"{worst.objective} (predicted {measured})"


def add_capacity_arguments(p: Any) -> None:
    """``loadlab capacity --simulate``'s flags (the server's come from ``setup``)."""
    from loadlab.simulate._setup import add_jitter_argument, add_server_arguments

    g = p.add_argument_group("the SLO bound by simulation (--simulate)")
    g.add_argument("--simulate", action="store_true", help="find the SLO-max rate by simulation")
    g.add_argument("--slo", metavar="FILE", help="SLO file the simulated levels are judged by")
    g.add_argument("--gpu-hour-price", type=float, metavar="USD", help="price of one GPU-hour")
    g.add_argument("--rates", metavar="R1,R2,...", help="rising rates to try (default: derived)")
    g.add_argument("--sim-duration", type=float, default=300.0,
                   help="simulated seconds per level (default 300); a low rate's level runs "
                        "until it has sent the SLO's min_requests")  # fmt: skip
    g.add_argument("--scenario", metavar="FILE", help="the workload (default: fixed lengths)")
    g.add_argument("--step-model", metavar="FILE", help="a fitted step-time model (JSON)")
    add_jitter_argument(g)
    g.add_argument("--extrapolate", action="store_true", help="allow past a fit's range")
    add_server_arguments(p)


def run_capacity(args: Any, model_spec: Any, hardware: Any) -> dict[str, Any]:
    """``loadlab capacity --simulate``: print the plan, return it as plain data."""
    from loadlab._capacity import roofline
    from loadlab._slo import load_slo
    from loadlab.config import RunConfig
    from loadlab.simulate._setup import load_step_model, server_from_args
    from loadlab.simulate._steptime import RooflineStepTime

    if not args.slo:
        raise ConfigError("--simulate needs --slo FILE: the objectives a level must meet")
    spec, dropped = ceilings_only(load_slo(args.slo))
    if args.step_model:
        step: StepTimeModel = load_step_model(args)
    elif model_spec is not None:
        step = RooflineStepTime(model_spec, hardware)
    else:
        raise ConfigError("--simulate needs --model and --hardware (a roofline) or --step-model")
    args.sim_model = model_spec.name if model_spec is not None else "ref-cpu"
    server = server_from_args(args, step)
    prompt, completion = args.prompt_tokens or 512, int(args.completion_tokens or 128)
    base = _base_config(args, RunConfig, prompt, completion)
    gpus = 1
    if model_spec is not None and hardware.kind == "gpu":
        gpus = roofline.gpus_per_replica(model_spec, hardware, prompt + completion)
    levels = ([float(x) for x in args.rates.split(",")] if args.rates
              else _default_rates(step, server, prompt, completion))  # fmt: skip
    plan = plan_capacity(base, server, step, spec, levels, peak_rps=args.peak_rps,
                         gpus_per_replica=gpus, gpu_hour_price=args.gpu_hour_price)  # fmt: skip
    print(f"simulated server: {server.mode}, max_num_seqs {server.max_num_seqs}, "
          f"{server.num_kv_blocks:,} KV blocks; {step.describe()}")  # fmt: skip
    if dropped:
        print(floors_line(dropped))
    print(plan.to_text())
    return plan.to_dict()


def _base_config(args: Any, run_config: Any, prompt: int, completion: int) -> RunConfig:
    wl: dict[str, Any] = {"kind": "synthetic", "prompt_tokens": prompt,
                          "output_tokens": completion}  # fmt: skip
    fields: dict[str, Any] = {}
    if args.scenario:
        from loadlab.scenario import load_scenario

        sc = load_scenario(args.scenario)
        wl = dict(sc.workload)
        fields = {"prompt_tokens": sc.prompt_tokens, "max_tokens": sc.max_tokens}
    return run_config(rate_rps=1.0, duration_s=args.sim_duration, workload=wl,  # type: ignore[no-any-return]
                      **{"prompt_tokens": prompt, "max_tokens": completion, **fields})  # fmt: skip


def _default_rates(step: Any, server: Any, prompt: int, completion: int) -> list[float]:
    """Rates around what a full batch could sustain: its decode step prices the guess."""
    b = server.max_num_seqs
    ctx = prompt + completion / 2
    step_s = float(step.step_s(0, b, b * ctx, b * (ctx - 1)))
    prefill_s = float(step.step_s(prompt, 0, prompt * (prompt + 1) / 2, 0))
    guess = b / (completion * step_s + prefill_s * b)  # requests/s a full batch turns over
    return rate_levels(guess / 16, guess * 1.5, 8)
