"""The lab watches the machine it measures on, and pins its processes where it can.

A lab figure is only as good as the CPU its processes got. ``MachineWatch`` brackets one
measurement and reports what else the machine was doing meanwhile, as the runner's monitor
does for the load generator:

- **CPU taken by other processes**, in cores: the machine's busy CPU time (``/proc/stat``:
  user, nice, system, irq, softirq) minus the CPU time of the lab's own process tree (the lab,
  its servers and their workers; psutil), over the measurement's wall time;
- **steal**: the share of CPU time the hypervisor gave to other guests (``/proc/stat``);
- the 1-minute load average at both ends.

``busy_reasons`` turns that, plus the server's own decode-step jitter (p90 / p50 of its
``step_seconds{phase="decode"}`` histogram over the measurement, ``step_jitter``), into the
reasons a figure measured then may be off; the report prints them beside every figure.

``plan_placement`` gives the load generator, each server and (disaggregated) each worker pool
cores of their own where the machine has them; ``pin`` applies it to a process.

Example::

    watch = MachineWatch.start()
    ...                                    # one measurement
    load = watch.stop()                    # {"wall_s": 9.8, "others_cores": 0.62, ...}
    busy_reasons(load, cpus=2)             # ['other processes took 0.62 cores']
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

__all__ = [
    "JITTER_LIMIT",
    "OTHERS_LIMIT_CORES",
    "STEAL_LIMIT",
    "MachineWatch",
    "Placement",
    "busy_reasons",
    "histogram_quantile",
    "pin",
    "pin_threads",
    "placement_report",
    "plan_placement",
    "step_jitter",
]

OTHERS_LIMIT_CORES = 0.25  # other processes' CPU beyond this competes with the lab (2 cores)
STEAL_LIMIT = 0.05  # a hypervisor taking 5 % of the CPU time
JITTER_LIMIT = 1.5  # decode steps of one steady batch: p90 over 1.5x p50 is not the model


def _proc_stat() -> tuple[float, float, float]:
    """(busy, steal, total) CPU seconds of the whole machine since boot (``/proc/stat``)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0, 0.0
    hz = float(os.sysconf("SC_CLK_TCK"))
    # user nice system idle iowait irq softirq steal (guest time is inside user already)
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0.0] * 8)[:8]
    busy = user + nice + system + irq + softirq
    return busy / hz, steal / hz, (busy + idle + iowait + steal) / hz


def _tree_cpu_s(root: int) -> dict[int, float]:
    """CPU seconds (user + system) of ``root`` and every descendant, by pid."""
    out: dict[int, float] = {}
    try:
        top = psutil.Process(root)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return out
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:
            continue
    return out


@dataclass(frozen=True)
class MachineWatch:
    """What the machine and the lab's process tree had used when a measurement started."""

    root_pid: int
    t_ns: int
    busy_s: float
    steal_s: float
    total_s: float
    tree: Mapping[int, float]
    load1: float | None

    @classmethod
    def start(cls, root_pid: int | None = None) -> MachineWatch:
        """Start watching; ``root_pid``: the lab process (default: this one)."""
        root = root_pid or os.getpid()
        busy, steal, total = _proc_stat()
        return cls(root, time.perf_counter_ns(), busy, steal, total, _tree_cpu_s(root), _load1())

    def stop(self) -> dict[str, Any]:
        """The measurement's machine figures (plain data for results files and lab.json)."""
        busy, steal, total = _proc_stat()
        wall_s = max((time.perf_counter_ns() - self.t_ns) / 1e9, 1e-9)
        tree = _tree_cpu_s(self.root_pid)
        # a process that ended during the measurement is missed (its time counts as others'):
        # the lab's servers live through every measurement, so only short helpers could be
        own_s = sum(max(0.0, cpu - self.tree.get(pid, 0.0)) for pid, cpu in tree.items())
        d_total = total - self.total_s
        return {
            "wall_s": wall_s,
            "own_cores": own_s / wall_s,
            "others_cores": max(0.0, (busy - self.busy_s) - own_s) / wall_s,
            "steal_share": (steal - self.steal_s) / d_total if d_total > 0 else 0.0,
            "load1_start": self.load1,
            "load1_end": _load1(),
        }


def _load1() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a cumulative histogram ``[(upper bound, count), ...]``
    (Prometheus ``histogram_quantile``: linear inside the bucket it falls in).

    >>> histogram_quantile([(1.0, 0), (2.0, 10), (4.0, 10), (float("inf"), 10)], 0.5)
    1.5
    """
    rows = sorted(buckets)
    if not rows or rows[-1][1] <= 0:
        return None
    rank = q * rows[-1][1]
    lo_bound, lo_count = 0.0, 0.0
    for bound, count in rows:
        if count >= rank:
            if bound == float("inf"):
                return lo_bound
            if count == lo_count:
                return bound
            return lo_bound + (bound - lo_bound) * (rank - lo_count) / (count - lo_count)
        lo_bound, lo_count = bound, count
    return None


def step_jitter(deltas: Mapping[str, float], phase: str = "decode") -> dict[str, float | None]:
    """p50, p90 (seconds) and p90 / p50 of the server's ``phase`` steps, from the change of its
    ``step_seconds_bucket`` counters over a measurement (``counter_deltas``)."""
    want = f'phase="{phase}"'
    rows = []
    for key, value in deltas.items():
        name, _, labels = key.partition("{")
        if name.endswith("step_seconds_bucket") and want in labels:
            le = labels.split('le="', 1)[1].split('"', 1)[0]
            rows.append((float("inf") if le == "+Inf" else float(le), value))
    p50, p90 = histogram_quantile(rows, 0.5), histogram_quantile(rows, 0.9)
    # inside the first bucket (0 to its bound) the interpolation says nothing about jitter
    first = min((b for b, _ in rows), default=0.0)
    if p50 is None or p90 is None or p50 <= first:
        return {"p50_s": p50, "p90_s": p90, "ratio": None}
    return {"p50_s": p50, "p90_s": p90, "ratio": p90 / p50}


def busy_reasons(load: Mapping[str, Any], cpus: int, jitter: float | None = None) -> list[str]:
    """Why a measurement may not show the machine's own speed ([] when nothing says so).

    Other processes count once they take more than ``OTHERS_LIMIT_CORES`` and more than the
    cores the lab left free (a many-core machine has room for them).

    >>> busy_reasons({"others_cores": 0.9, "own_cores": 1.5, "steal_share": 0.0}, cpus=2)
    ['other processes took 0.90 cores']
    """
    out = []
    others, own = load.get("others_cores") or 0.0, load.get("own_cores") or 0.0
    if others > max(OTHERS_LIMIT_CORES, cpus - own - 0.5):
        out.append(f"other processes took {others:.2f} cores")
    if (load.get("steal_share") or 0.0) > STEAL_LIMIT:
        out.append(f"steal {load['steal_share']:.0%}")
    if jitter is not None and jitter > JITTER_LIMIT:
        out.append(f"server decode steps p90/p50 {jitter:.2f}")
    return out


# ---------------------------------------------------------------- placement


@dataclass(frozen=True)
class Placement:
    """CPUs for each of the lab's processes (``()``: leave it where the OS puts it)."""

    generator: tuple[int, ...] = ()
    server: tuple[int, ...] = ()  # one engine: API and engine thread together
    api: tuple[int, ...] = ()  # disaggregated: the API process
    prefill: tuple[int, ...] = ()
    decode: tuple[int, ...] = ()


def plan_placement(cpus: Sequence[int], threads: int | None = 1) -> Placement:
    """Own cores for the load generator, the server and (disaggregated) each worker pool.

    One CPU: nothing to pin. Two: the generator (and a disaggregated server's API process and
    its niced prefill pool) on the first, the engine (or the decode pool) on the second, so a
    decode step never waits for the generator. More: prefill gets its own core(s) too.

    >>> plan_placement([0, 1])
    Placement(generator=(0,), server=(1,), api=(0,), prefill=(0,), decode=(1,))
    """
    c = tuple(sorted(cpus))
    if len(c) < 2:
        return Placement()
    n = max(1, threads or 1)
    server = c[1 : 1 + n]
    if len(c) == 2:
        return Placement(c[:1], server, c[:1], c[:1], c[1:])
    rest = c[1:]
    half = max(1, len(rest) // 2)
    return Placement(c[:1], server, c[:1], rest[:half], rest[half:])


def pin(pid: int, cpus: Sequence[int]) -> bool:
    """Pin ``pid`` (threads it starts later inherit it) to ``cpus``; False where it cannot."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return False
    try:
        os.sched_setaffinity(pid, set(cpus))
    except OSError:
        return False
    return True


def pin_threads(pid: int, cpus: set[int]) -> None:
    """Every thread of running process ``pid`` onto ``cpus`` (affinity is per thread on
    Linux, so ``pin`` on a process already running moves only its main thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


def placement_report(pids: Mapping[str, int], children: bool = True) -> dict[str, str]:
    """Where each named process (and, with ``children``, its child processes) may run, read
    back from the OS."""
    out = {}
    for name, pid in pids.items():
        try:
            proc = psutil.Process(pid)
            out[name] = _cpus(proc.cpu_affinity())
            for child in proc.children(recursive=True) if children else ():
                out[f"{name}: child process {child.pid}"] = _cpus(child.cpu_affinity())
        except (psutil.Error, AttributeError):
            out[name] = "unknown"
    return out


def _cpus(cpus: Sequence[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus)) or "-"
