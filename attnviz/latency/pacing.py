"""Keeping a sweep inside its time budget, and saying how long it has left, from runs timed on
this machine rather than from the cost model alone.

The cost model prices a point before any run (a guess that can be several times off on a busy
host); once a run has been timed, the time of the next run is that run's time scaled by the
model's ratio between the two points (ratios of the model hold far better than its absolute
numbers). `Pacer.check` runs before every timed run, like a `Deadline.check`, and stops the
sweep BEFORE a run that would end past the deadline, so the sweep ends inside its budget
instead of one long run after it. `Pacer.eta` is the time left: the work still to do, priced by
the model, times how much slower than the model this machine has been so far.
"""
from __future__ import annotations

import time

from attnviz.base.jobs import Deadline, JobTimeout


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
