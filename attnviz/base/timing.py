"""The one timer: `measure(fn, repeats, warmup)` -> `Timing` (every run's seconds, median, quantiles).

Every latency number in attnviz (sweeps, the cost model's microbenchmarks, prune-and-measure, the
Lab's variant timings, toy-model latency) comes from here, so they agree on what a run is:
`warmup` untimed calls first (allocator, kernels and caches settle), then `repeats` timed calls,
each bracketed by one clock reading before and after. The median is the figure to quote; the
quantiles (linear interpolation, as `numpy.quantile` / `torch.quantile` / `statistics.quantiles(
method="inclusive")` give) say how noisy it was.

`measure` does not enter `torch.inference_mode()` (this layer imports no torch): wrap the call
when timing a forward pass. `check` (e.g. `Deadline.check`, `Cancel.check`) runs before every
call, warm-up included, so a deadline or a closed tab stops a long measurement between runs.
Callers that interleave several functions (prune-and-measure alternates three models to share
the machine's drift fairly) time one call at a time with `measure(fn, 1, 0)` and merge with
`Timing.of`.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable

CLOCKS: dict[str, Callable[[], float]] = {
    "wall": time.perf_counter,   # latency as a user sees it
    "cpu": time.process_time,    # this process's CPU time: ignores other programs on a shared machine;
}                                # equals latency only with one thread


def quantile(values: Iterable[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) with linear interpolation between order statistics."""
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("quantile of no values: time at least one run")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must lie in [0, 1], not {q}")
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Timing:
    """Seconds of each timed run, in the order they ran; statistics are derived from them."""
    times: tuple[float, ...]

    def __post_init__(self):
        if not self.times:
            raise ValueError("a Timing needs at least one timed run")

    @classmethod
    def of(cls, times: Iterable[float]) -> "Timing":
        return cls(tuple(float(t) for t in times))

    def quantile(self, q: float) -> float:
        return quantile(self.times, q)

    @property
    def runs(self) -> int:
        return len(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def q1(self) -> float:
        return self.quantile(0.25)

    @property
    def q3(self) -> float:
        return self.quantile(0.75)

    @property
    def quartiles(self) -> tuple[float, float, float]:
        return self.q1, self.median, self.q3

    @property
    def p10(self) -> float:
        return self.quantile(0.10)

    @property
    def p90(self) -> float:
        return self.quantile(0.90)

    # milliseconds, as tables and the sweep CSV report them
    @property
    def times_ms(self) -> list[float]:
        return [1e3 * t for t in self.times]

    @property
    def median_ms(self) -> float:
        return 1e3 * self.median

    @property
    def p10_ms(self) -> float:
        return 1e3 * self.p10

    @property
    def p90_ms(self) -> float:
        return 1e3 * self.p90


def measure(fn: Callable[[], object], repeats: int = 5, warmup: int = 1, *,
            clock: str | Callable[[], float] = "wall", check: Callable[[], None] | None = None) -> Timing:
    """Call `fn` `warmup` times untimed, then `repeats` times timed. `clock`: "wall", "cpu" or a
    zero-argument function returning seconds. `check` runs before every call (it raises to stop)."""
    repeats, warmup = int(repeats), int(warmup)
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be at least 1 and warmup at least 0")
    if callable(clock):
        timer = clock
    elif clock in CLOCKS:
        timer = CLOCKS[clock]
    else:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)} (or a function returning seconds)")
    for _ in range(warmup):
        if check is not None:
            check()
        fn()
    times = []
    for _ in range(repeats):
        if check is not None:
            check()
        t0 = timer()
        fn()
        times.append(timer() - t0)
    return Timing.of(times)


def speed_words(ratio: float) -> str:
    """How a measured speed-up reads: within 5 % either way is "about as fast" (timing noise)."""
    if ratio > 1.05:
        return "faster"
    return "slower" if ratio < 0.95 else "about as fast"
