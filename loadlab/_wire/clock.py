"""loadlab's clock and the packets': ``perf_counter_ns`` (CLOCK_MONOTONIC) and the kernel's
packet timestamps (CLOCK_REALTIME).

``ClockMap`` maps the second onto the first: the offset between the two clocks is sampled back
to back at the start and at the end of a capture (the tightest of several samples each time),
and interpolated between them, so a real-time clock slewed by NTP during the run stays mapped.

Example::

    start = clock_offset_ns()
    ...  # the capture
    clock = ClockMap.between(start, clock_offset_ns())
    clock.to_perf_ns(packet_ns), clock.drift_ns
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["ClockMap", "clock_offset_ns"]


def clock_offset_ns(samples: int = 25) -> tuple[int, int, int]:
    """(perf_counter_ns at the sample, CLOCK_REALTIME minus perf_counter_ns, the sample's
    uncertainty in ns): the tightest of ``samples`` back-to-back readings (realtime read
    between two perf_counter reads; the offset is taken against their midpoint)."""
    best: tuple[int, int, int] | None = None
    perf, real = time.perf_counter_ns, time.clock_gettime_ns
    rt = time.CLOCK_REALTIME
    for _ in range(samples):
        a = perf()
        r = real(rt)
        b = perf()
        if best is None or b - a < best[2]:
            mid = (a + b) // 2
            best = (mid, r - mid, b - a)
    assert best is not None  # noqa: S101 - samples >= 1
    return best


@dataclass(frozen=True)
class ClockMap:
    """CLOCK_REALTIME -> perf_counter_ns, from an offset sampled at the start and at the end
    (linear between them: NTP slews the real-time clock, never the monotonic one)."""

    start_perf_ns: int
    start_offset_ns: int
    end_perf_ns: int
    end_offset_ns: int
    uncertainty_ns: int  # the worse of the two samples' widths

    @classmethod
    def between(cls, start: tuple[int, int, int], end: tuple[int, int, int]) -> ClockMap:
        return cls(start[0], start[1], end[0], end[1], max(start[2], end[2]))

    @property
    def drift_ns(self) -> int:
        """How far the real-time clock moved against the monotonic one during the capture."""
        return self.end_offset_ns - self.start_offset_ns

    def to_perf_ns(self, real_ns: int) -> int:
        # perf = start_perf + x / (1 + drift / span) inside the span, x the time past the
        # start at the start's offset (kept small: a float holds 1e18 ns to 256 ns only)
        x = real_ns - self.start_offset_ns - self.start_perf_ns
        span = self.end_perf_ns - self.start_perf_ns
        if x <= 0 or span <= 0:
            return real_ns - self.start_offset_ns
        if x >= span + self.drift_ns:
            return real_ns - self.end_offset_ns
        return self.start_perf_ns + round(x * span / (span + self.drift_ns))

    def to_dict(self) -> dict[str, int]:
        return {
            "start_offset_ns": self.start_offset_ns,
            "end_offset_ns": self.end_offset_ns,
            "drift_ns": self.drift_ns,
            "uncertainty_ns": self.uncertainty_ns,
        }
