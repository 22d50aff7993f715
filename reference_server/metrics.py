"""Server-side counters and their Prometheus text exposition (``GET /metrics``).

The engine thread records steps; the API thread records rejections and renders. A lock keeps
a render from seeing half a step. Names (all prefixed ``loadlab_server_``)::

    requests_in_flight                gauge    admitted by the API, not yet answered
    queue_depth                       gauge    requests waiting (queued or preempted)
    running_requests                  gauge    requests in the running batch
    batch_slots                       gauge    slots the batch holds (static: idle ones included)
    kv_blocks_used / kv_blocks_total  gauge    paged KV cache blocks (used: held by a request)
    kv_blocks_cached                  gauge    blocks holding a cached prefix (held or free)
    step_seconds{phase}               histogram  forward-pass step time; phase = prefill|decode|mixed
                                               (10 buckets a decade: fine enough for step jitter)
    steps_total{phase}                counter
    tokens_total{phase}               counter  tokens processed (prefill), generated (decode), or
                                               recomputed as padding rows (static, pad)
    steps_while_waiting_total         counter  steps that decoded while requests waited for a slot
    decode_tokens_while_waiting_total counter  their decode tokens: / the steps above = useful
                                               decode rows per step while work waits (what static
                                               batching's finished slots waste)
    preemptions_total                 counter  sequences preempted (recomputed later)
    prefix_cache_queries_total        counter  prompt tokens of admitted requests (vLLM's
                                               prefix_cache_queries; recomputes not counted)
    prefix_cache_hits_total           counter  of which served from the prefix cache
    requests_total{finish_reason}     counter  finished requests: length|stop|abort|error
    rejected_requests_total{reason}   counter  refused before admission (queue_full, ...)

On CUDA (``torch.cuda.is_available()``) the page also describes the GPU the server runs on,
under the names loadlab reads as GPU telemetry (``loadlab run --gpu-metrics URL/metrics``;
labels ``gpu``, ``UUID``, ``Hostname``, ``modelName``; a quantity the driver does not report is
left out)::

    loadlab_gpu_utilization_percent   gauge    (torch.cuda.utilization; needs pynvml)
    loadlab_gpu_memory_used_bytes     gauge    used on the device, every process's
    loadlab_gpu_power_watts           gauge    (torch.cuda.power_draw)
    loadlab_gpu_sm_clock_hertz        gauge    (torch.cuda.clock_rate)
    loadlab_gpu_temperature_celsius   gauge
    loadlab_gpu_energy_joules_total   counter  since the driver loaded (NVML, Volta and later)

Besides ``/metrics``: the step log (``GET /v1/step_log``), the last ``STEP_LOG_SIZE`` steps
each with its wall time from the engine loop's start of the step (inbox drained, batch
scheduled) to its tokens handed to the API, and its shape in the simulator's step features
(``loadlab.simulate._steptime``): what a step-time model is fitted on (``loadlab simulate
--fit-steps``). The histogram above times only the forward pass and postprocess.

Usage::

    stats = ServerStats()
    stats.record_step("decode", 0.012, prefill_tokens=0, decode_tokens=32)
    text = stats.render(gauges={"queue_depth": 3}, counters={"preemptions_total": 0})
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import socket
import sys
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "PHASES",
    "STEP_BUCKETS_S",
    "STEP_LOG_FIELDS",
    "STEP_LOG_SIZE",
    "ServerStats",
    "gpu_lines",
]

PHASES = ("prefill", "decode", "mixed")
# Step times span ~1 ms (tiny model decode) to seconds (a 2k-token CPU prefill). Ten buckets a
# decade (each 1.26x the last) so a client (loadlab lab) can read the step time's jitter from
# two scrapes: a coarser 1-2.5-5 ladder put every decode step of a run in one bucket.
STEP_BUCKETS_S = tuple(round(10 ** (k / 10 - 3), 6) for k in range(41))  # 1 ms .. 10 s
PREFIX = "loadlab_server_"
# steps kept for GET /v1/step_log: a whole sweep of 30-second levels on this CPU (~8 MB);
# at 8192 the log of such a sweep had lost its first levels by its end
STEP_LOG_SIZE = 32768
# One step-log entry: who stepped (engine, or a disaggregated worker's role and rank), when
# (perf_counter_ns at the step's start and after its tokens were handed on), and its shape.
STEP_LOG_FIELDS = ("role", "rank", "start_ns", "end_ns", "prefill_tokens", "decode_tokens",
                   "attn_pairs", "kv_read_tokens")  # fmt: skip


class ServerStats:
    """Thread-safe counters and step-time histograms for one server."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bucket_counts = {p: [0] * (len(STEP_BUCKETS_S) + 1) for p in PHASES}
        self._step_sum_s = dict.fromkeys(PHASES, 0.0)
        self._tokens: Counter[str] = Counter()
        self._finished: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._waiting_steps = 0
        self._waiting_decode_tokens = 0
        self._step_log: deque[tuple[str, int, int, int, int, int, int, int]] = deque(
            maxlen=STEP_LOG_SIZE
        )

    def log_step(
        self, role: str, rank: int, start_ns: int, end_ns: int, shape: tuple[int, int, int, int]
    ) -> None:
        """One step for the step log (a deque append: atomic, no lock on the step path)."""
        self._step_log.append((role, rank, start_ns, end_ns, *shape))

    def step_log(self) -> list[dict[str, str | int]]:
        """The logged steps, oldest first, as ``STEP_LOG_FIELDS`` dicts."""
        return [dict(zip(STEP_LOG_FIELDS, e, strict=True)) for e in list(self._step_log)]

    def record_step(
        self,
        phase: str,
        seconds: float,
        *,
        prefill_tokens: int,
        decode_tokens: int,
        padding_tokens: int = 0,
        waiting: bool = False,
    ) -> None:
        """``waiting``: requests were still waiting for a slot when this step was scheduled."""
        with self._lock:
            self._bucket_counts[phase][bisect.bisect_left(STEP_BUCKETS_S, seconds)] += 1
            self._step_sum_s[phase] += seconds
            self._tokens["prefill"] += prefill_tokens
            self._tokens["decode"] += decode_tokens
            if padding_tokens:
                self._tokens["padding"] += padding_tokens
            if waiting and decode_tokens:
                self._waiting_steps += 1
                self._waiting_decode_tokens += decode_tokens

    def record_finished(self, finish_reason: str) -> None:
        with self._lock:
            self._finished[finish_reason] += 1

    def record_rejected(self, reason: str) -> None:
        with self._lock:
            self._rejected[reason] += 1

    def num_rejected(self) -> int:
        with self._lock:
            return sum(self._rejected.values())

    def num_steps(self, phase: str) -> int:
        with self._lock:
            return sum(self._bucket_counts[phase])

    def render(self, *, gauges: Mapping[str, float], counters: Mapping[str, float]) -> str:
        """Prometheus text format 0.0.4 of these stats plus the caller's gauges and counters."""
        lines: list[str] = []
        for name, value in gauges.items():
            lines += [f"# TYPE {PREFIX}{name} gauge", f"{PREFIX}{name} {_num(value)}"]
        for name, value in counters.items():
            lines += [f"# TYPE {PREFIX}{name} counter", f"{PREFIX}{name} {_num(value)}"]
        with self._lock:
            lines.append(f"# TYPE {PREFIX}step_seconds histogram")
            for phase in PHASES:
                cumulative = 0
                for bound, count in zip(
                    (*STEP_BUCKETS_S, float("inf")), self._bucket_counts[phase], strict=True
                ):
                    cumulative += count
                    le = "+Inf" if bound == float("inf") else repr(bound)
                    lines.append(
                        f'{PREFIX}step_seconds_bucket{{phase="{phase}",le="{le}"}} {cumulative}'
                    )
                lines.append(
                    f'{PREFIX}step_seconds_sum{{phase="{phase}"}} {self._step_sum_s[phase]!r}'
                )
                lines.append(f'{PREFIX}step_seconds_count{{phase="{phase}"}} {cumulative}')
            lines.append(f"# TYPE {PREFIX}steps_total counter")
            for phase in PHASES:
                n = sum(self._bucket_counts[phase])
                lines.append(f'{PREFIX}steps_total{{phase="{phase}"}} {n}')
            for name, value in (
                ("steps_while_waiting_total", self._waiting_steps),
                ("decode_tokens_while_waiting_total", self._waiting_decode_tokens),
            ):
                lines += [f"# TYPE {PREFIX}{name} counter", f"{PREFIX}{name} {value}"]
            lines += _labelled(
                "tokens_total", "phase", self._tokens, ("prefill", "decode", "padding")
            )
            lines += _labelled(
                "requests_total", "finish_reason", self._finished, ("length", "stop", "abort")
            )
            lines += _labelled("rejected_requests_total", "reason", self._rejected, ("queue_full",))
        return "\n".join(lines) + "\n"


def _labelled(name: str, label: str, values: Counter[str], always: tuple[str, ...]) -> list[str]:
    keys = list(always) + sorted(k for k in values if k not in always)
    return [f"# TYPE {PREFIX}{name} counter"] + [
        f'{PREFIX}{name}{{{label}="{k}"}} {values[k]}' for k in keys
    ]


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def gpu_lines() -> list[str]:
    """The ``loadlab_gpu_*`` lines of the GPU this server runs on; none without CUDA."""
    # A server that never imported torch (the fake preset) runs nothing on a GPU; importing it
    # here would stall the event loop for seconds on the first scrape.
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return []
    i = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(i)
    uuid = f"GPU-{props.uuid}"
    labels = f'Hostname="{socket.gethostname()}",UUID="{uuid}",gpu="{i}",modelName="{props.name}"'
    reads: dict[str, tuple[str, Callable[[], float]]] = {
        "utilization_percent": ("gauge", lambda: torch.cuda.utilization(i)),
        "memory_used_bytes": ("gauge", lambda: _used(torch.cuda.mem_get_info(i))),
        "power_watts": ("gauge", lambda: torch.cuda.power_draw(i) / 1000),  # mW
        "sm_clock_hertz": ("gauge", lambda: torch.cuda.clock_rate(i) * 1e6),  # MHz
        "temperature_celsius": ("gauge", lambda: torch.cuda.temperature(i)),
        "energy_joules_total": ("counter", lambda: _nvml_energy_j(uuid)),
    }
    lines = []
    for name, (kind, read) in reads.items():
        with contextlib.suppress(Exception):  # no pynvml, or not on this board: left out
            value = float(read())
            lines += [
                f"# TYPE loadlab_gpu_{name} {kind}",
                f"loadlab_gpu_{name}{{{labels}}} {value!r}",
            ]
    return lines


def _used(free_total: tuple[int, int]) -> int:
    return free_total[1] - free_total[0]


@functools.cache
def _nvml() -> Any:
    import pynvml  # nvidia-ml-py; torch's own GPU readings use it too

    pynvml.nvmlInit()  # once per process
    return pynvml


def _nvml_energy_j(uuid: str) -> float:
    nvml = _nvml()
    handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
    return float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1000  # mJ
