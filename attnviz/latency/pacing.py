"""Keeping a sweep inside its time budget, and saying how long it has left, from runs timed on
this machine rather than from the cost model alone.

The cost model prices a point before any run (a guess that can be several times off on a busy
host); once a run has been timed, the time of the next run is that run's time scaled by the
model's ratio between the two points (ratios of the model hold far better than its absolute
numbers). `Pacer.check` runs before every timed run, like a `Deadline.check`, and stops the
sweep BEFORE a run that would end past the deadline, so the sweep ends inside its budget
instead of one long run after it. `Pacer.eta` is the time left: the work still to do, priced by
the model, times how much slower than the model this machine has been so far.

`first_point_estimate` is the same idea before a sweep starts: its smallest measured point is timed
here as the sweep will run it (warm-up, repeats, memory pass), and every point is priced from it by
the cost model's ratios, plus the fixed cost per point (inputs, the memory profiler) timed with it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from attnviz.base.jobs import Deadline, JobTimeout
from attnviz.core.attention import parse_variant
from attnviz.latency import costmodel, measure
from attnviz.latency.crossover import estimate_seconds
from attnviz.latency.results import with_heads


class Pacer:
    """`check()` before each run; `point(cost)` when the next runs are of a point the model prices
    at `cost` (any unit, as long as every point uses the same one)."""

    def __init__(self, deadline: Deadline | None, total_cost: float = 0.0):
        self.deadline = deadline
        self.total_cost = float(total_cost)   # the model's price of every run still to come, in all
        self.done_cost = 0.0                  # of the points finished or started
        self.cost = None                      # the current point's price per run
        self.run_s = 0.0                      # the longest run timed at the current point
        self.last = None                      # when the previous check ran (None: new point)
        self.per_cost = None                  # seconds per unit of cost, from the runs timed
        self.started = time.perf_counter()
        self.timed_s = 0.0                    # seconds spent in timed points so far

    def point(self, cost: float, runs: int = 1):
        """The next runs are `runs` runs of a point priced `cost` each."""
        if self.cost and self.run_s:
            self.per_cost = self.run_s / self.cost
        self.cost, self.run_s, self.last = max(float(cost), 1e-12), 0.0, None
        self.done_cost += self.cost * runs

    def next_run_s(self) -> float:
        """What the next run should take: the longest run of this point so far, else the last point's
        speed applied to this one's price; 0 before anything was timed."""
        if self.run_s:
            return self.run_s
        return 0.0 if self.per_cost is None or self.cost is None else self.per_cost * self.cost

    def check(self):
        """The deadline's own check, then `ahead`."""
        if self.deadline is not None:
            self.deadline.check()
        self.ahead()

    def ahead(self):
        """Stop (JobTimeout) when the next run would end past the deadline; it times the run before."""
        now = time.perf_counter()
        if self.last is not None:
            self.run_s = max(self.run_s, now - self.last)
        self.last = now
        remaining = getattr(self.deadline, "remaining", None)  # a deadline that only counts checks has none
        if remaining is None:
            return
        need = self.next_run_s()
        if need > remaining:
            raise JobTimeout(f"{self.deadline.what} stopped before its time limit of {self.deadline.seconds:g} s: "
                             f"the next run would take about {need:,.1f} s and {max(0.0, remaining):,.1f} s "
                             "were left")

    def eta(self) -> float | None:
        """Seconds left at this machine's pace so far (None before the first timed run)."""
        speed = self.per_cost if self.per_cost is not None else (
            self.run_s / self.cost if self.run_s and self.cost else None)
        if speed is None:
            return None
        return max(0.0, self.total_cost - self.done_cost) * speed


@dataclass
class FirstPoint:
    seconds: float        # the whole sweep's estimate, from the point timed here
    point_s: float        # the point's own time here, as the sweep runs it
    label: str            # which point: "minilm · fused · n=16"
    speed: float          # measured / the cost model's price of one run


def first_point_estimate(plan, models: dict, profile, check=None) -> FirstPoint | None:
    """Time the sweep's smallest measured point here (the first model, variant and thread count
    measured in this process) and price the whole sweep from it: each point's runs at the model's
    ratio to this one, and the fixed cost per point (inputs, the memory pass) as timed here; the
    one-block crossover by the model, at the same speed. None when nothing is measured here."""
    here = measure.threads_now()
    points = [p for p in plan.points({k: m.cfg for k, m in models.items()}) if p[3] == here]
    if "cpu" not in plan.backends or not points:
        return None
    key, _, variant, _, n = min(points, key=lambda p: (p[4], plan.models.index(p[0])))
    model = models[key]
    runs = plan.warmup + plan.repeats
    started = time.perf_counter()
    point = measure.measure_point(model, n, variant, warmup=plan.warmup, repeats=plan.repeats, threads=here,
                                  clock=plan.clock, memory=plan.memory, quiet=True, check=check)
    point_s = time.perf_counter() - started
    run_s = point.timing.median_ms / 1e3
    priced = costmodel.predict(model.cfg, n, profile, variant, threads=here).total_ms / 1e3
    speed = run_s / max(priced, 1e-9)
    # inputs, the memory profiler and Python around the runs; the profiled pass's own run scales as a run
    fixed = max(0.0, point_s - (runs + plan.memory) * run_s)
    dtypes = len(plan.measured_dtypes())
    seconds = 0.0
    for key_p, k, v, t, n_p in plan.points({kk: m.cfg for kk, m in models.items()}):
        cfg = models[key_p].cfg
        shape = cfg if k == cfg.n_heads else with_heads(cfg, k)
        one = costmodel.predict(shape, n_p, profile, v, threads=t).total_ms / 1e3 * speed
        seconds += dtypes * (runs * one + fixed + (one if plan.memory else 0.0))
    if plan.crossover:
        v0 = parse_variant(plan.variants[0])
        seconds += speed * sum(estimate_seconds(models[k].cfg, profile, v0, plan.repeats, plan.warmup)
                               for k in plan.models)
    return FirstPoint(seconds, point_s, f"{key} · {variant.name} · n={n}", speed)
