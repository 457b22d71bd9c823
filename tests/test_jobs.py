"""Server-wide bounds on heavy work (attnviz.jobs) and spreadsheet-safe CSV (attnviz.exports)."""
import threading

import pandas as pd
import pytest
import torch

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


def test_the_busy_message_says_only_that_the_server_is_busy():
    """It named what other users were running."""
    with jobs.heavy_job("someone's private-document sweep", limit=1):
        with pytest.raises(jobs.ServerBusy) as err:
            with jobs.heavy_job("head scores", limit=1):
                pass
    message = str(err.value)
    assert "busy" in message and "try head scores again in a moment" in message.lower()
    assert "private-document" not in message and "sweep" not in message and "1 heavy job(s)" not in message


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


def test_cancel_polls_its_conditions_latches_and_is_a_should_stop():
    polls = []
    gone = jobs.Cancel(lambda: polls.append(1) or len(polls) >= 3, reason="the tab was closed")
    assert not gone() and not gone.is_set()          # a Cancel is also a should_stop()
    with pytest.raises(jobs.JobCancelled, match="the tab was closed"):
        gone.check()                                  # third poll: the condition holds
    assert gone() and len(polls) == 3                 # latched: no more polling
    check = jobs.checks(None, jobs.Deadline(60), jobs.Cancel())
    check()                                           # nothing due
    with pytest.raises(jobs.JobTimeout):
        jobs.checks(jobs.Cancel(), jobs.Deadline(0))()


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


# ---------------------------------------------------------------- the shared cache (attnviz.base.lru)
def test_lru_is_bounded_in_entries_and_in_bytes():
    import numpy as np
    import torch

    from attnviz.base.lru import LRU, nbytes
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
    from attnviz.base.lru import LRU
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


# ---------------------------------------------------------------- a job whose session goes away (17.2)
def _session_goes_away_after_three_steps():
    """An AppTest script: a heavy job through attnviz.ui.job_controls; the browser session goes away during
    step 3 (the runtime stops listing it), so the check before step 4 cancels the job."""
    import streamlit as st
    from streamlit import runtime

    from attnviz.base import jobs
    from attnviz.ui import job_controls

    steps = []
    try:
        with job_controls.heavy_job("a long job", limit=1) as cancel:
            assert jobs.running_jobs() == ["a long job"]
            for step in range(1000):
                cancel.check()
                steps.append(step)
                if step == 2:
                    runtime.get_instance().is_active_session.return_value = False   # the tab closes
    except jobs.JobCancelled as err:
        st.write(f"cancelled after {len(steps)} steps: {err}")
    st.write(f"slots held: {len(jobs.running_jobs())}")


def test_a_heavy_job_whose_session_goes_away_frees_its_slot_within_one_step():
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_function(_session_goes_away_after_three_steps).run(timeout=60)
    assert not at.exception
    said = [m.value for m in at.markdown]
    assert said == ["cancelled after 3 steps: the browser session that started this job has gone",
                    "slots held: 0"], said
    assert jobs.running_jobs() == []


def _session_stays():
    import streamlit as st

    from attnviz.ui import job_controls
    with job_controls.heavy_job("a job") as cancel:
        st.write(f"session known: {job_controls.current_session_id() is not None}, cancelled: {cancel()}")


def test_a_session_bound_cancel_reads_a_live_session_as_live_and_plain_python_as_nothing_to_watch():
    from streamlit.testing.v1 import AppTest

    from attnviz.ui import job_controls
    at = AppTest.from_function(_session_stays).run(timeout=60)
    assert [m.value for m in at.markdown] == ["session known: True, cancelled: False"]
    assert job_controls.current_session_id() is None      # no script run here: nothing to watch
    with job_controls.heavy_job("plain", limit=1) as cancel:
        assert not cancel() and jobs.running_jobs() == ["plain"]
    assert jobs.running_jobs() == []


# ---------------------------------------------------------------- every heavy loop checks between steps
def _gone_after(k: int) -> jobs.Cancel:
    """A Cancel whose session is live for k polls, then gone."""
    polls = []
    return jobs.Cancel(lambda: polls.append(1) or len(polls) > k, reason="gone")


def test_head_scores_stop_within_one_layer_of_the_session_going_away():
    from attnviz.analysis import head_scores
    from attnviz.weights.catalogue import random_model
    from tests.tiny import LLAMA
    model = random_model(LLAMA, seed=3)
    blocks = []
    real = type(model.net.blocks[0]).forward
    with pytest.raises(jobs.JobCancelled):
        with jobs.heavy_job("head scores", limit=1):
            for block in model.net.blocks:
                block.forward = (lambda x, _b=block, **kw: blocks.append(1) or real(_b, x, **kw))
            head_scores.head_scores(model, seq_len=8, n_seqs=2, cancel=_gone_after(2))
    assert len(blocks) == 2 and jobs.running_jobs() == []     # two blocks ran, the third was never started


def test_importance_curves_and_speedup_stop_within_one_step(monkeypatch):
    from attnviz.analysis.importance import EvalSet, ablation_importance, gradient_importance
    from attnviz.latency.speedup import measure_speedup
    from attnviz.weights.catalogue import random_model
    from tests.tiny import LLAMA
    model = random_model(LLAMA, seed=3)
    data = EvalSet(ids=torch.randint(0, LLAMA.vocab_size, (5, 12), generator=torch.Generator().manual_seed(0)),
                   n_tokens=60, available=60)
    grad = gradient_importance(model, data, should_stop=_gone_after(2))
    assert grad.done == 2 and not grad.complete and grad.stopped == "stopped"
    abl = ablation_importance(model, data, should_stop=_gone_after(3))
    assert abl.done == 3 and not abl.complete
    keep = torch.ones(LLAMA.n_layers, LLAMA.n_heads, dtype=torch.bool)
    keep[0, 0] = False
    runs = []
    real = type(model.net).forward

    def counting(self, *a, **kw):
        runs.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(type(model.net), "forward", counting)       # the full, pruned and no-attention models
    sp = measure_speedup(model, keep, lengths=(8, 16), repeats=5, warmup=1, should_stop=_gone_after(2))
    # polls: before length 8 (1), before round 1 (2), before round 2: gone -> 3 warm-up + 3 timed runs
    assert len(runs) == 3 + 3 and not sp.complete and sp.table.empty


def test_training_and_its_memory_measurement_stop_within_one_step():
    from attnviz.toys import tasks
    from attnviz.toys.training import TrainSettings, train, training_memory
    s = TrainSettings(task=tasks.Task("copy", length=3), n_layers=2, d_model=32, steps=50, batch_size=8)
    result = train(s, should_stop=_gone_after(4))
    assert result.stopped_early and result.steps_done == 4
    polls = []
    gone = jobs.Cancel(lambda: polls.append(1) or len(polls) > 1)
    with pytest.raises(jobs.JobCancelled):
        training_memory(s, check=gone.check)
    assert len(polls) == 2    # polled before the warm-up step, then before its first block: gone


def _head_scores_view_whose_session_goes_away():
    import streamlit as st
    from streamlit import runtime

    from attnviz.base import jobs
    from attnviz.ui import attention_views
    from attnviz.weights.catalogue import random_model
    from tests.tiny import LLAMA

    polls = []
    # live for two polls (before layers 0 and 1 of the first batch), then the tab is closed
    runtime.get_instance().is_active_session.side_effect = lambda sid: polls.append(sid) or len(polls) <= 2
    try:
        attention_views.head_score_table("tiny", 8, 2, 0, random_model(LLAMA, seed=3))
        st.write("finished")
    except jobs.JobCancelled as err:
        st.write(f"cancelled after {len(polls)} polls: {err}; slots held {len(jobs.running_jobs())}")


def test_attention_head_scores_stop_when_their_session_goes_away():
    """Attention › Compute head scores (the view's own cached function) with the tab closed mid-run."""
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_function(_head_scores_view_whose_session_goes_away).run(timeout=120)
    assert not at.exception
    assert [m.value for m in at.markdown] == [
        "cancelled after 3 polls: the browser session that started this job has gone; slots held 0"]
    assert jobs.running_jobs() == []


def test_the_quantization_table_stops_between_copies_and_frees_its_slot(monkeypatch):
    """Latency › "Measure int8 and bf16 copies": a closed tab stops it before the next copy (one
    copy exists at a time) and its heavy-job slot is free again."""
    from attnviz.latency import quantize
    from attnviz.weights.catalogue import random_model
    from tests.tiny import LLAMA
    copies = []
    real = quantize.quantized_copy
    monkeypatch.setattr(quantize, "quantized_copy", lambda model, mode, *a: copies.append(mode) or real(model, mode, *a))
    cancel = _gone_after(2)     # live for the first model's load and first copy, gone before the second
    with pytest.raises(jobs.JobCancelled):
        with jobs.heavy_job("quantization", limit=1):
            quantize.quantization_table(keys=("a", "b"), modes=["int8", "int8"], rounds=1,
                                        loader=lambda key: random_model(LLAMA, seed=1), check=cancel.check)
    assert copies == ["int8"] and jobs.running_jobs() == []
