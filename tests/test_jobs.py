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
