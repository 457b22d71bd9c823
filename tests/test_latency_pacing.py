"""A latency sweep keeps inside its time budget and says what it did: it stops BEFORE a run that
would end past its deadline (paced from the runs timed here), its stop message names what was
left out (never a bare "not measured:"), an engine that would add no row is refused with why, the
decode rows measured before a deadline are kept, and each device keeps one colour and dash."""
from __future__ import annotations

import time

import pandas as pd
import pytest

from attnviz.base import jobs
from attnviz.base.timing import Timing
from attnviz.figures import latency_figures
from attnviz.latency import costmodel, decode, measure, pacing, sweep

TINY = "synthetic:layers=2,d=32,heads=4,ff=64,vocab=50,positions=64"
TINY_CAUSAL = "synthetic:layers=2,d=32,heads=4,kv=2,ff=64,vocab=50,positions=64,causal=1"


class Clock:
    """A clock the test moves by hand: the pacer's decisions, not the machine's speed, are tested."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(time, "perf_counter", c)
    return c


def test_the_pacer_stops_before_a_run_that_would_end_past_the_deadline(clock):
    deadline = jobs.Deadline(10, "the sweep")
    pacer = pacing.Pacer(deadline, total_cost=1 * 3 + 2 * 3)
    pacer.point(1.0, runs=3)
    for t in (0.0, 3.0, 6.0):  # runs of 3 s: each fits in what is left
        clock.now = t
        pacer.check()
    assert pacer.eta() == pytest.approx(2 * 3 * 3.0)  # the 2-cost point's three runs, at 3 s per unit
    clock.now = 9.0           # 1 s left, a 3 s run to come: stop now, not at 12 s
    with pytest.raises(jobs.JobTimeout, match="stopped before its time limit of 10 s: the next run would take about 3.0 s"):
        pacer.check()


def test_the_pacer_scales_a_new_point_by_the_models_ratio(clock):
    pacer = pacing.Pacer(jobs.Deadline(100, "the sweep"))
    pacer.point(1.0)
    pacer.check()
    clock.now = 2.0
    pacer.check()             # one 2 s run of a point priced 1
    pacer.point(4.0)          # priced 4x: its first run should take about 8 s
    assert pacer.next_run_s() == pytest.approx(8.0)
    clock.now = 95.0          # 5 s left
    with pytest.raises(jobs.JobTimeout):
        pacer.check()


class StopsAfter(jobs.Deadline):
    """Expires after `checks` checks: where the sweep stops is set by the test, not by the clock."""

    def __init__(self, checks: int):
        super().__init__(60, "the sweep")
        self.left = checks

    def expired(self):
        self.left -= 1
        return self.left < 0


@pytest.fixture(scope="module")
def tiny():
    return {TINY: measure.load(TINY)}


@pytest.mark.parametrize("checks", range(0, 40, 3))
def test_a_stopped_sweep_says_what_it_left_out_wherever_it_stops(monkeypatch, tiny, checks):
    """Before: a stop after every point had a run ended "...; not measured:" with nothing after it."""
    monkeypatch.setattr(sweep, "steady_profile", lambda *a, **k: costmodel.HOST_GUESS)  # no 3 calibrations
    plan = sweep.SweepPlan(models=[TINY], seq_lens=[8, 16], backends=["cpu"], repeats=2, warmup=0, memory=False,
                           crossover=True)
    df = sweep.run_sweep(plan, tiny, deadline=StopsAfter(checks))
    stopped = df.attrs["stopped"]
    if stopped:
        assert not stopped.rstrip().endswith(":")
        assert "not measured: " in stopped or "every point had at least one timed run" in stopped
        tail = stopped.split("not measured: ")[-1] if "not measured: " in stopped else "x"
        assert tail.strip(), stopped
    else:  # nothing stopped it: both lengths and every block length measured
        assert (df["measured"] & df["test"].isna()).sum() == 2
        assert set(df[df["measured"] & (df["test"] == "block")]["seq_len"]) == set(df[df["test"] == "block"]["seq_len"])


def test_an_engine_that_runs_none_of_the_chosen_dtypes_is_refused_with_why():
    """Before: picking ggml beside torch with fp32 drew nothing for ggml and said nothing."""
    plan = sweep.SweepPlan(models=[TINY], seq_lens=[8], backends=["pi4"], engines=["torch", "ggml"], dtypes=["fp32"])
    with pytest.raises(ValueError, match="ggml runs fp16, q8_0, q4_0.*none of the chosen dtypes"):
        plan.check()
    sweep.SweepPlan(models=[TINY], seq_lens=[8], backends=["pi4"], engines=["torch", "ggml"],
                    dtypes=["fp32", "fp16"]).check()


def test_decode_rows_measured_before_the_deadline_are_kept():
    plan = sweep.SweepPlan(models=[TINY_CAUSAL], seq_lens=[8], backends=["cpu"], repeats=1, warmup=0, memory=False)
    models = {TINY_CAUSAL: measure.load(TINY_CAUSAL)}
    df = decode.decode_sweep(plan, models, [16, 0], n_prompt=8, deadline=StopsAfter(2))  # 2 runs: depth 0 only
    cpu = df[df["measured"]]
    assert set(cpu["test"]) == {"pp", "tg"} and cpu[cpu["test"] == "tg"]["depth"].tolist() == [0]
    assert "decode rows measured before it are kept" in df.attrs["stopped"]


def rows(backend: str, measured: bool, scale: float) -> pd.DataFrame:
    return pd.DataFrame(dict(model="m", variant="fused", n_heads=4, threads=4, backend=backend, engine="torch",
                             dtype="fp32", measured=measured, seq_len=[16, 64, 256],
                             median_ms=[0.5 * scale, 5 * scale, 500 * scale], p10_ms=0.4, p90_ms=600,
                             peak_mem_mb=[1.0, 2.0, 4.0 + scale], tokens_per_s=[1.0, 2.0, 3.0]))


def styles(fig) -> dict:
    return {t.name: (t.line.color, t.line.dash) for t in fig.data if t.name and not t.name.startswith("slope")}


def test_each_device_keeps_one_colour_and_dash_in_every_chart_and_log_ticks_are_whole():
    """Before: Pi 4 took another colour in each chart, and both Pis the same dash; a log axis
    labelled 0.5 and 500 both "5"."""
    df = pd.concat([rows("cpu", True, 1), rows("pi4", False, 3), rows("pi5", False, 2)], ignore_index=True)
    alone = pd.concat([rows("pi4", False, 3), rows("pi5", False, 2)], ignore_index=True)
    seen = {}
    for fig in (latency_figures.latency_figure(df), latency_figures.throughput_figure(alone),
                latency_figures.latency_figure(alone, log=True)):
        for name, style in styles(fig).items():
            device = next(b for b in ("cpu", "pi4", "pi5") if name.startswith(b))
            assert seen.setdefault(device, style) == style, (device, style)
    panels = {"x": "cpu", "x2": "pi4", "x3": "pi5"}  # the growth figure: one panel per device, in this order
    for t in latency_figures.growth_figure(df).data:
        if not t.name.startswith("slope"):
            assert (t.line.color, t.line.dash) == seen[panels[t.xaxis]], t.name
    assert len({seen["pi4"], seen["pi5"], seen["cpu"]}) == 3
    assert seen["pi4"][0] != seen["pi5"][0] and seen["pi4"][1] != seen["pi5"][1]
    assert seen["cpu"][1] == "solid"  # measured
    log = latency_figures.latency_figure(df, log=True)
    assert log.layout.yaxis.type == "log" and log.layout.yaxis.minorloglabels == "complete"
    growth = latency_figures.growth_figure(df)
    assert growth.layout.yaxis.minorloglabels == "complete"


def test_the_first_point_estimate_times_the_smallest_point_and_prices_the_rest_by_the_model(monkeypatch):
    """The pre-run estimate: the smallest measured point timed here (as the sweep runs it), the
    others priced at the cost model's ratio to it. A clock moved by hand makes it exact."""
    clock = Clock()
    monkeypatch.setattr(pacing.time, "perf_counter", clock)
    timed = []

    def fake_point(model, n, variant, **kw):          # the point "takes" 1.5 s: 4 runs of 0.3 s + 0.3 s fixed
        timed.append(n)
        clock.now += 1.5
        return measure.Point(n, Timing.of([0.3] * kw["repeats"]), 1.0)
    monkeypatch.setattr(pacing.measure, "measure_point", fake_point)
    monkeypatch.setattr(pacing.measure, "threads_now", lambda: 1)
    model = measure.load(TINY)
    profile = costmodel.HOST_GUESS
    plan = sweep.SweepPlan(models=[TINY], seq_lens=[32, 8, 16], threads=[1], backends=["cpu", "pi4"], repeats=3,
                           warmup=1, memory=False, crossover=False).check()
    first = pacing.first_point_estimate(plan, {TINY: model}, profile)
    assert timed == [8] and first.label.endswith("n=8") and first.point_s == 1.5
    priced = {n: costmodel.predict(model.cfg, n, profile, "fused", threads=1).total_ms / 1e3 for n in (8, 16, 32)}
    speed = 0.3 / priced[8]
    assert first.speed == pytest.approx(speed)
    # each point: 4 runs at the model's ratio to n=8, and the 0.3 s timed beside the runs
    assert first.seconds == pytest.approx(sum(4 * priced[n] * speed + 0.3 for n in (8, 16, 32)))
    one = sweep.SweepPlan(models=[TINY], seq_lens=[8], threads=[1], backends=["cpu"], repeats=3, warmup=1,
                          memory=False, crossover=False).check()
    assert pacing.first_point_estimate(one, {TINY: model}, profile).seconds == pytest.approx(1.5)
    modelled_only = sweep.SweepPlan(models=[TINY], seq_lens=[8], threads=[1], backends=["pi4"], crossover=False).check()
    assert pacing.first_point_estimate(modelled_only, {TINY: model}, profile) is None
