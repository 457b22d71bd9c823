"""Server-wide bounds on heavy work (attnviz.jobs) and spreadsheet-safe CSV (attnviz.exports)."""
import threading

import pandas as pd
import pytest

from attnviz.base import exports
from attnviz.base import jobs


def test_heavy_job_refuses_one_more_than_the_limit_and_frees_slots():
    with jobs.heavy_job("sweep", limit=2), jobs.heavy_job("training", limit=2):
        assert sorted(jobs.running_jobs()) == ["sweep", "training"]
        with pytest.raises(jobs.ServerBusy, match="at most 2") as err:
            with jobs.heavy_job("importance", limit=2):
                pass
        assert isinstance(err.value, ValueError)
    assert jobs.running_jobs() == []
    with jobs.heavy_job("importance", limit=2):   # slots are free again
        assert jobs.running_jobs() == ["importance"]


def test_heavy_job_frees_its_slot_when_the_job_fails():
    with pytest.raises(RuntimeError):
        with jobs.heavy_job("sweep", limit=1):
            raise RuntimeError("boom")
    assert jobs.running_jobs() == []


def test_heavy_job_limit_holds_across_threads():
    limit, started, release = 2, threading.Barrier(4), threading.Event()
    outcomes = []

    def worker():
        try:
            with jobs.heavy_job("t", limit=limit):
                outcomes.append("ran")
                started.wait()
                release.wait(30)
        except jobs.ServerBusy:
            outcomes.append("busy")
            started.wait()

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    started.wait(30)   # all three have either taken a slot or been refused
    release.set()
    for t in threads:
        t.join(30)
    assert sorted(outcomes) == ["busy", "ran", "ran"]
    assert jobs.running_jobs() == []


def test_deadline_and_cancel():
    assert not jobs.Deadline(None).expired()
    jobs.Deadline(60).check()
    with pytest.raises(jobs.JobTimeout, match="time limit of 0 s"):
        jobs.Deadline(0, "the sweep").check()
    cancel = jobs.Cancel()
    cancel.check()
    cancel.set()
    with pytest.raises(jobs.JobCancelled):
        cancel.check()


def test_csv_export_neutralises_formula_cells_and_keeps_numbers():
    df = pd.DataFrame({"token": ["=1+1", "+cmd", "-2", "@SUM(A1)", "\tx", "plain", "▁it"],
                       "value": [-1.5, 2.0, -3.0, 0.0, 1.0, 2.0, 3.0],
                       "=bad": range(7)})
    text = exports.csv_text(df)
    back = pd.read_csv(__import__("io").StringIO(text))
    assert list(back.columns) == ["token", "value", "'=bad"]
    assert back["token"].tolist() == ["'=1+1", "'+cmd", "'-2", "'@SUM(A1)", "'\tx", "plain", "▁it"]
    assert back["value"].tolist() == [-1.5, 2.0, -3.0, 0.0, 1.0, 2.0, 3.0]   # numbers untouched
    assert df["token"].iloc[0] == "=1+1"   # the caller's frame is not changed


# ---------------------------------------------------------------- the one timer (attnviz.base.timing)
def test_measure_warms_up_then_times_each_run_with_its_clock():
    from attnviz.base import timing
    ticks = iter(range(100))
    calls, checks = [], []
    t = timing.measure(lambda: calls.append(1), repeats=4, warmup=2, clock=lambda: float(next(ticks)) ** 2,
                       check=lambda: checks.append(1))
    assert len(calls) == 6 and len(checks) == 6              # checked before every call, warm-up included
    assert t.times == (1.0, 5.0, 9.0, 13.0)                  # one reading before (0, 4, 16, 36) and after each
    assert t.runs == 4 and t.median == 7.0 and t.median_ms == 7000.0 and t.times_ms == [1e3, 5e3, 9e3, 13e3]
    assert t.quartiles == pytest.approx((4.0, 7.0, 10.0))    # linear interpolation, as numpy / torch give
    assert (t.p10, t.p90) == pytest.approx((2.2, 11.8))
    assert timing.Timing.of([2.0]).quartiles == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="repeats"):
        timing.measure(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="clock"):
        timing.measure(lambda: None, clock="sundial")


def test_measure_quantiles_agree_with_torch_and_stop_at_a_check():
    import torch

    from attnviz.base import timing
    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4, 0.8]
    want = torch.tensor(values, dtype=torch.float64).quantile(torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9],
                                                                           dtype=torch.float64))
    assert [timing.quantile(values, q) for q in (0.1, 0.25, 0.5, 0.75, 0.9)] == pytest.approx(want.tolist())
    cancel, calls = jobs.Cancel(), []

    def run():
        calls.append(1)
        if len(calls) == 2:
            cancel.set()                                     # e.g. the session went away mid-measurement

    with pytest.raises(jobs.JobCancelled):
        timing.measure(run, repeats=10, warmup=1, check=cancel.check)
    assert len(calls) == 2


# ---------------------------------------------------------------- the shared cache (attnviz.base.cache)
def test_lru_is_bounded_in_entries_and_in_bytes():
    import numpy as np
    import torch

    from attnviz.base.cache import LRU, nbytes
    assert nbytes(torch.zeros(1000)) == 4000 and nbytes(np.zeros(10, dtype=np.int64)) == 80
    frame = pd.DataFrame({"x": np.zeros(1000)})
    assert nbytes(frame) >= 8000
    shared = torch.zeros(1000)
    assert 8000 <= nbytes({"a": torch.zeros(1000), "b": [torch.zeros(1000), shared, shared]}) < 13000

    store = LRU(max_entries=10, max_bytes=10_000)
    store.put("a", torch.zeros(1000))                        # 4,000 bytes
    store.put("b", torch.zeros(1000))
    assert store.get("a") is not None                        # a is now the most recent
    store.put("c", torch.zeros(1000))                        # 12,000 > 10,000: the least recent (b) goes
    assert "b" not in store and "a" in store and "c" in store and store.nbytes == 8000
    assert store.put("huge", torch.zeros(10_000)) is False   # alone over the bound: refused, nothing dropped
    assert "huge" not in store and len(store) == 2
    store.put("a", torch.zeros(10))                          # replacing an entry re-counts its size
    assert store.nbytes == 4040
    assert store.pop("a").numel() == 10 and store.nbytes == 4000
    store.clear()
    assert len(store) == 0 and store.nbytes == 0
    few = LRU(2)                                             # entries only: no sizes taken
    for k in "xyz":
        few.put(k, k)
    assert "x" not in few and len(few) == 2
    with pytest.raises(ValueError, match="max_bytes"):
        LRU(2, max_bytes=0)


def test_lru_holds_its_bounds_across_threads():
    from attnviz.base.cache import LRU
    store = LRU(max_entries=1000, max_bytes=50 * 4096)

    def worker(i):
        for j in range(200):
            store.put((i, j), bytes(4000))
            store.get((i, j - 1))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert 0 < len(store) <= 50 and store.nbytes <= 50 * 4096
