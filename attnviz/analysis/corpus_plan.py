"""What a corpus run will cost, and the budget it keeps: work counted before it starts, timed as
it goes.

Work is counted in forward-tokens: the tokens of every forward pass the run makes (an item's
gradient pass counts as `GRADIENT_FORWARDS` forwards; a masked output counts one forward per
distinct mask, the full output one more). For one model a forward-token costs about the same
FLOPs, so `latency.corpus_cost` prices a plan in FLOPs and seconds from the cost model; here the
run only needs the ratio: the rate measured on this machine in its first batch (forward-tokens a
second) gives the time left, and the time the next batch will take.

`Budget` is checked before each batch starts: a batch that would end past the budget, at the
rate measured so far, is not started, so a run ends inside its budget or at most one batch past it
(a batch slower than the ones before). Its clock is injectable: tests count batches, never seconds.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

TEXTS_PER_TASK = 4      # texts a batch carries: 4 x 128 tokens of an LM's logits with their gradient stay < 1 GB
BATCH_MULTIPLE = 2      # batches come in multiples of two, so two workers (a 2-core machine) share them evenly
# (text, mask) rows a masked batch carries: a pruning curve's 25 masks x 4 texts made batches of 5-9 s,
# the last of a phase kept one of two workers waiting up to 3 s, and two workers slowed each other
# ~25 % on the large activations; 1 text x 25 masks (300+ token rows a product, the kernels'
# plateau) gave two local workers 1.7x one, against 1.5x at 2 texts a batch
MASK_ROWS = 32
GRADIENT_FORWARDS = 3   # a forward and its backward, as forwards (the backward's two products per one)
PROBE_FORWARDS = 2      # each encoder probe of the Gauss-Newton diagonal: one more backward
# Seconds a forward-token takes in each phase, against a masked forward's: on a quiet 2-core machine a
# gradient pass's products reached 0.63 of the fp32 matmul peak and a masked forward's 0.77
# (bench/corpus_speed.py). A phase not measured yet is priced from the rate of one that was, at this
# ratio: a pruning curve priced from its first (gradient) batch at the gradient's own rate came out 1.5x long.
PACE = {"importance": 1.2, "scored": 1.0}


def pace(phase: str | None) -> float:
    return PACE.get(phase, 1.0)


def batches(items: list[tuple[int, object]], tokens: list[int] | None,
            per_task: int = TEXTS_PER_TASK) -> list[tuple[int, list]]:
    """(index, item) -> [(first index, [(index, item), ...])]: items of like length together (less
    padding), split into an even number of near-equal batches. The same items always give the same
    batches, whichever engine runs them, so the figures do not depend on where they ran."""
    if not items:
        return []
    order = sorted(items, key=lambda it: (tokens[it[0]] if tokens else 0, it[0]))
    n = math.ceil(len(order) / per_task)
    n = min(len(order), n + n % BATCH_MULTIPLE if n > 1 else n)
    groups = [list(g) for g in np.array_split(np.arange(len(order)), n)]
    return [(order[g[0]][0], [order[i] for i in g]) for g in groups if len(g)]


def texts_per_task(params: dict, per_task: int = TEXTS_PER_TASK) -> int:
    """Texts a batch of a phase carries (`params` the phase's): a masked batch (`params["codes"]`,
    the masks each text runs under besides the full model) as many as fit MASK_ROWS rows."""
    codes = params.get("codes")
    return per_task if not codes else max(1, min(per_task, MASK_ROWS // (1 + len(codes))))


def distinct_masks(run_kind: str, fractions, orders: int) -> int:
    """Masked forwards an item needs before the importance is known: one per mask that can differ
    from the full model (a curve's fraction 0 is the full model itself)."""
    if run_kind == "pruning_curve":
        return sum(1 for f in fractions if f > 0) * (1 + int(orders))
    return 0 if run_kind == "importance" else 1


@dataclass
class Plan:
    """Forward-tokens per item of each phase ("importance", "scored")."""
    phases: dict[str, list[float]] = field(default_factory=dict)

    def total(self) -> float:
        return float(sum(sum(v) for v in self.phases.values()))

    def of(self, phase: str, indices) -> float:
        units = self.phases.get(phase, [])
        return float(sum(units[i] for i in indices)) if units else 0.0

    def work(self) -> float:
        """The forward-tokens, each phase's at its `pace`: what the time a run takes is proportional to."""
        return float(sum(pace(phase) * sum(v) for phase, v in self.phases.items()))


def plan(run_kind: str, model_kind: str, tokens: list[int] | None, n_items: int, *, masks: int,
         cells: int, probes: int) -> Plan:
    """The run's plan: `tokens` per item (None: items that are not text count 1 each), `masks`
    distinct masks scored per item, `cells` = layers x heads (single-head ablation's forwards),
    `probes` the encoder's Gauss-Newton probes."""
    toks = [float(t) for t in tokens] if tokens else [1.0] * n_items
    out = Plan()
    if run_kind != "mask":
        if model_kind == "lm":
            per = GRADIENT_FORWARDS
        elif model_kind == "encoder":
            per = GRADIENT_FORWARDS + PROBE_FORWARDS * probes
        else:
            per = 1 + cells
        out.phases["importance"] = [per * t for t in toks]
    if run_kind != "importance":
        out.phases["scored"] = [(1 + masks) * t for t in toks]
    return out


class Budget:
    """A run's time budget (None: no budget, only the estimate) on `clock`; `begin(phase)` as a phase
    starts, `finished(units)` after each batch, `exhausted(next_units)` before the next one starts.
    Rates are kept per phase (a gradient pass and a masked forward use the machine differently); a
    phase not measured yet is priced from the rate measured so far at its `pace`."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.perf_counter):
        if seconds is not None and not seconds > 0:
            raise ValueError(f"the time budget must be a positive number of seconds; got {seconds!r}")
        self.seconds, self.clock = seconds, clock
        self.start = clock()
        self.first = None           # when the first batch started (the model loaded, the plan made)
        self.units = 0.0            # forward-tokens finished
        self.batches = 0
        self.stopped = False
        self.phase, self.phase_start = None, None
        self.done: dict[str, float] = {}       # forward-tokens finished per phase
        self.spent: dict[str, float] = {}      # seconds of the phases before the current one

    def begin(self, phase: str = "run"):
        """Batches of `phase` start now."""
        now = self.clock()
        if self.first is None:
            self.first = now
        if phase != self.phase:
            if self.phase is not None:
                self.spent[self.phase] = self.spent.get(self.phase, 0.0) + now - self.phase_start
            self.phase, self.phase_start = phase, now
            self.done.setdefault(phase, 0.0)

    def elapsed(self) -> float:
        return self.clock() - self.start

    def rate(self, phase: str | None = None) -> float | None:
        """Forward-tokens a second measured since the first batch started, or within `phase` (None
        before a batch of it ended)."""
        if phase is not None:
            seconds = self.spent.get(phase, 0.0) + (self.clock() - self.phase_start if phase == self.phase else 0.0)
            units = self.done.get(phase, 0.0)
            return units / seconds if units and seconds > 0 else None
        if not self.batches or self.first is None:
            return None
        spent = self.clock() - self.first
        return self.units / spent if spent > 0 else None

    def priced(self, phase: str | None) -> float | None:
        """The rate `phase`'s forward-tokens go at: its own once measured, else the work rate measured
        so far (every phase's tokens at their `pace`) at this phase's pace."""
        own = self.rate(phase) if phase is not None else None
        if own:
            return own
        if not self.batches or self.first is None:
            return None
        spent = self.clock() - self.first
        work = sum(pace(p) * units for p, units in self.done.items())
        return work / spent / pace(phase) if spent > 0 and work > 0 else None

    def finished(self, units: float):
        self.units += units
        self.batches += 1
        if self.phase is not None:
            self.done[self.phase] += units

    def exhausted(self, next_units: float = 0.0) -> bool:
        """Whether the next batch (`next_units` forward-tokens) must not start: the budget is spent,
        or the batch would end past it at the measured rate."""
        if self.seconds is None:
            return False
        now = self.elapsed()
        rate = self.priced(self.phase)
        ahead = next_units / rate if rate else 0.0
        self.stopped = self.stopped or now + ahead > self.seconds
        return self.stopped

    def estimate(self, plan: Plan) -> dict:
        """The run's figures so far: forward-tokens done / planned, seconds spent, the measured rate
        and (once measured) the seconds the whole run and what is left of it take at the rates
        measured (each phase at its own, once it has one)."""
        total, rate, spent = plan.total(), self.rate(), self.elapsed()
        left = None
        if rate:
            left = sum(max(sum(units) - self.done.get(phase, 0.0), 0.0) / self.priced(phase)
                       for phase, units in plan.phases.items())
        return dict(units_done=self.units, units_total=total, seconds=spent, rate=rate, batches=self.batches,
                    forward_rate=self.priced("scored") if rate else None,
                    seconds_left=left, seconds_total=None if left is None else spent + left,
                    budget=self.seconds)
