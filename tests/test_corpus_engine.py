"""Corpus runs on the engine: in-process, on a LocalCluster and on a real scheduler with two worker
processes, one of them killed mid-run; figures identical everywhere, nothing finished lost."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import distributed
import numpy as np
import pandas as pd
import pytest
import torch

from attnviz.analysis import corpus_engine, corpus_metrics, corpus_runs
from attnviz.analysis.corpus import Corpus
from attnviz.analysis.pruning import decode_mask, encode_mask

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply today.", "A kitten is resting on a rug.",
         "I love you very much.", "The train leaves at noon.", "Rain is expected over the hills tonight."]
CURVE = dict(fractions=(0.0, 0.3), random_orders=1)
# a local cluster of one worker per core: never beside another test that takes every core
pytestmark = pytest.mark.xdist_group("whole_machine")


def corpus(n=len(TEXTS)):
    return Corpus(key="test-texts", kind="text", items=TEXTS[:n], labels=None, notes=[], source="tests",
                  licence="test text")


@pytest.fixture(scope="module")
def reference():
    """The in-process pruning curve (importance, then masks) every cluster run must equal."""
    return corpus_runs.run("minilm", corpus(), "pruning_curve", **CURVE)


@pytest.fixture
def same_threads(monkeypatch):
    """Workers at this process's torch thread count: float sums then split the same way."""
    monkeypatch.setenv(corpus_engine.WORKER_THREADS_ENV, str(torch.get_num_threads()))


def assert_same(a, b):
    pd.testing.assert_frame_equal(a.table, b.table, check_exact=True)
    pd.testing.assert_frame_equal(a.summary, b.summary, check_exact=True)
    assert a.extra["importance"] == b.extra["importance"]
    assert a.extra["curve"] == b.extra["curve"]


def test_scheduler_choices(monkeypatch):
    monkeypatch.delenv(corpus_engine.SCHEDULER_ENV, raising=False)
    assert corpus_engine.resolve_scheduler(None) is None
    assert corpus_engine.resolve_scheduler("local") == "local"
    assert corpus_engine.local_workers("local:3") == 3
    monkeypatch.setenv(corpus_engine.SCHEDULER_ENV, "tcp://10.0.0.5:8786")
    assert corpus_engine.resolve_scheduler(None) == "tcp://10.0.0.5:8786"
    assert corpus_engine.resolve_scheduler("in-process") is None
    for bad in ("local:0", "http://x", "tcp://a b", "; rm -rf /"):
        with pytest.raises(ValueError, match="scheduler"):
            corpus_engine.resolve_scheduler(bad)


def test_curve_in_process(reference):
    r = reference
    assert r.complete and r.done == r.total == 2 * len(TEXTS)
    assert r.extra["mark"] == 0.3 and r.extra["workers"] == {"in-process": 2 * len(TEXTS)}
    # each item scored under the full mask, importance order and one random order at 30 %
    assert len(r.table) == len(TEXTS) * 4 and set(r.table["order"]) == {"importance", "random 1"}
    at = {p["order"]: p["value"] for p in r.extra["curve"] if p["fraction"] == 0.3}
    assert at["importance"] > at["random 1"]     # removing the least important heads hurts least
    assert all(p["value"] == pytest.approx(1.0, abs=1e-6) for p in r.extra["curve"] if p["fraction"] == 0)
    scores = torch.tensor(r.extra["importance"])
    assert torch.allclose(scores.norm(dim=1), torch.ones(6), atol=1e-6)   # normalised per layer


def test_importance_is_the_mean_of_each_items_importance():
    """Each item's own (per-text) importance, averaged; the run computes them in one padded batch,
    equal up to float rounding (tests/test_corpus_batch.py's tolerance)."""
    each = [corpus_runs.importance_task("minilm", dict(seed=0), i, t)["raw"] for i, t in enumerate(TEXTS[:2])]
    two = corpus_runs.run("minilm", corpus(2), "importance").summary.sort_values(["layer", "head"])
    np.testing.assert_allclose(two["raw"].to_numpy().reshape(6, 12), (each[0] + each[1]) / 2, rtol=0, atol=1e-5)
    assert (two["ci_low"] <= two["value"]).all() and (two["value"] <= two["ci_high"]).all()


def test_ablation_importance_is_each_heads_drop_of_the_primary_metric():
    """What translators, speech and vision models get (run here on MiniLM, where it is quick)."""
    got = corpus_runs.ablation_task("minilm", dict(seed=0), 0, TEXTS[0])["raw"]
    model = corpus_engine.worker_model("minilm")
    full = corpus_metrics.output(model, TEXTS[0])
    for i, h in ((0, 0), (3, 7)):
        mask = torch.ones(6, 12)
        mask[i, h] = 0
        want = 1.0 - corpus_metrics.compare("encoder", full, corpus_metrics.output(model, TEXTS[0], mask))["cosine"]
        assert got[i, h] == pytest.approx(want, abs=1e-6)
    assert got.shape == (6, 12) and (got > -1e-6).all()


def test_local_cluster_gives_identical_figures(reference, same_threads):
    got = corpus_runs.run("minilm", corpus(), "pruning_curve", scheduler="local:2", **CURVE)
    assert got.complete and sum(got.extra["workers"].values()) == 2 * len(TEXTS)
    assert_same(reference, got)


def test_a_local_worker_keeps_its_memory_and_takes_one_batch_at_a_time():
    """Dask's default worker environment returns freed memory to the system past 64 KB, so every
    activation of every batch was mapped and zeroed again (two local workers then slowed each other
    ~25 %); and a worker queued a second batch, so the dearest-first order did not decide who ran what."""
    with corpus_engine.connect("local:1") as client:
        env = client.run(lambda: {k: os.environ.get(k) for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")})
        saturation = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.WORKER_SATURATION)
    (got,) = env.values()
    assert int(got["MALLOC_TRIM_THRESHOLD_"]) >= 1 << 30 and int(got["MALLOC_MMAP_THRESHOLD_"]) == 1 << 25
    assert saturation == 1.0


def test_stop_keeps_what_finished_and_resume_finishes_it_identically(tmp_path, reference):
    path = tmp_path / "run.jsonl"
    seen = []
    part = corpus_runs.run("minilm", corpus(), "pruning_curve", resume=path, progress=lambda d, t, p: seen.append(d),
                           should_stop=lambda: len(seen) >= 3, **CURVE)
    assert not part.complete and part.done == 3 and len(part.table) == 3
    assert len(path.read_text().splitlines()) == 1 + 3
    more = []
    full = corpus_runs.run("minilm", corpus(), "pruning_curve", resume=path, progress=lambda d, t, p: more.append(d),
                           **CURVE)
    assert more[0] == 4 and full.complete       # the three finished items were not run again
    assert_same(reference, full)
    with pytest.raises(ValueError, match="another run"):
        corpus_runs.run("minilm", corpus(), "importance", resume=path)


def test_mask_run_scores_the_editors_mask():
    keep = torch.ones(6, 12, dtype=torch.bool)
    keep[0] = False
    r = corpus_runs.run("minilm", corpus(3), "mask", mask=encode_mask(keep))
    assert list(r.table["heads_kept"]) == [60] * 3 and (r.table["cosine"] < 1).all()
    row = r.summary[r.summary["metric"] == "cosine"].iloc[0]
    assert row["ci_low"] <= row["value"] <= row["ci_high"] and row["n"] == 3
    with pytest.raises(ValueError, match="layers"):
        corpus_runs.run("minilm", corpus(3), "mask", mask="2x2-f")
    with pytest.raises(ValueError, match="run kind"):
        corpus_runs.run("minilm", corpus(3), "speed")


def test_heads_4_vs_8_halves_every_layer(reference):
    r = corpus_runs.run("minilm", corpus(3), "heads_4_vs_8")
    assert r.extra["kept_per_layer"] == [6] * 6
    keep = torch.tensor(r.extra["keep"])
    imp = torch.tensor(r.extra["importance"])
    for i in range(6):  # the kept half is the more important half
        assert imp[i][keep[i]].min() >= imp[i][~keep[i]].max()
    assert decode_mask(r.extra["steps"][0]["code"], 6, 12).equal(keep)


def test_results_file_round_trips_arrays_exactly(tmp_path):
    f = corpus_engine.ResultsFile(tmp_path / "r.jsonl", dict(run="x"))
    value = dict(a=np.array([0.1, 1 / 3], dtype=np.float32), b=[float("nan"), 2.5], c=np.array([[1, 2]]))
    f.add("p", 0, value)
    with (tmp_path / "r.jsonl").open("a") as out:
        out.write('{"phase": "p", "index": 1, "resu')          # a line cut short by a crash
    back = corpus_engine.ResultsFile(tmp_path / "r.jsonl", dict(run="x")).records
    assert set(back) == {("p", 0)}
    got = back[("p", 0)]
    assert got["a"].dtype == np.float32 and got["a"].tobytes() == value["a"].tobytes()
    assert np.isnan(got["b"][0]) and got["c"].tolist() == [[1, 2]]
    (tmp_path / "bad.jsonl").write_text("not json\n")
    with pytest.raises(ValueError, match="not a corpus-run results file"):
        corpus_engine.ResultsFile(tmp_path / "bad.jsonl", dict(run="x"))


def _spawn(args, env):
    return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def test_real_scheduler_and_two_workers_one_killed_mid_run(tmp_path, reference, same_threads):
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               OMP_NUM_THREADS=str(torch.get_num_threads()))
    file = tmp_path / "scheduler.json"
    procs = [_spawn(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
                     "--no-dashboard", "--scheduler-file", str(file)], env)]
    try:
        with distributed.Client(scheduler_file=str(file), timeout=60) as client:
            address = client.scheduler.address
            workers = [_spawn(["distributed.cli.dask_worker", address, "--nthreads", "1", "--no-nanny",
                               "--no-dashboard"], env) for _ in range(2)]
            procs += workers
            client.wait_for_workers(2, timeout=60)
            pid_of = client.run(os.getpid)                       # worker address -> process id
        killed = {}

        def progress(done, total, partial):
            if not killed and partial is not None and "order" in partial.table and len(partial.table) == 4:
                address, pid = next(iter(pid_of.items()))
                os.kill(pid, signal.SIGKILL)
                killed[address] = pid

        got = corpus_runs.run("minilm", corpus(), "pruning_curve", scheduler=address, progress=progress, **CURVE)
        assert killed and got.complete and got.done == got.total
        ((dead, pid),) = killed.items()
        assert next(p for p in workers if p.pid == pid).wait(timeout=30) == -signal.SIGKILL
        survivor = next(a for a in pid_of if a != dead)
        assert got.extra["workers"].get(survivor, 0) > 0
        assert_same(reference, got)              # nothing lost, nothing different
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def test_results_file_lines_are_json(tmp_path):
    path = tmp_path / "r.jsonl"
    corpus_runs.run("minilm", corpus(2), "importance", resume=path)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["run"]["kind"] == "importance" and [x["index"] for x in lines[1:]] == [0, 1]
