"""The app's corpus results files are bounded in bytes together (oldest removed first, a cancelled
run's file kept for resume and counted), and a worker whose model cache is read-only and lacks the
model says which model and what to run instead of raising a PermissionError."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnviz.analysis import corpus_engine, corpus_runs
from attnviz.analysis.corpus import Corpus
from attnviz.analysis.corpus_engine import ResultsStore

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply today.", "A kitten is resting on a rug.",
         "I love you very much.", "The train leaves at noon."]
MASK = torch.ones(6, 12)
MASK[0, :6] = 0


def texts(n, key="t"):
    return Corpus(key=key, kind="text", items=TEXTS[:n], labels=None, notes=[], source="tests", licence="test")


def aged(path: Path, seconds_ago: int):
    t = path.stat().st_mtime - seconds_ago
    os.utime(path, (t, t))


def test_make_room_removes_the_oldest_others_never_the_current(tmp_path):
    store = ResultsStore(tmp_path, 100)
    for name, age in (("old.jsonl", 30), ("mid.jsonl", 20), ("new.jsonl", 10)):
        (tmp_path / name).write_bytes(b"x" * 30)
        aged(tmp_path / name, age)
    (tmp_path / "other.txt").write_bytes(b"y" * 500)         # not a results file: neither counted nor removed
    assert store.used() == 90 and [p.name for p in store.files()] == ["old.jsonl", "mid.jsonl", "new.jsonl"]
    assert store.make_room(tmp_path / "old.jsonl", 40)      # old is the current run's: mid goes instead
    assert sorted(p.name for p in store.files()) == ["new.jsonl", "old.jsonl"] and store.used() == 60
    assert not store.make_room(tmp_path / "old.jsonl", 80)   # alone it cannot fit: everything else went
    assert [p.name for p in store.files()] == ["old.jsonl"] and (tmp_path / "other.txt").exists()
    with pytest.raises(ValueError, match="positive"):
        ResultsStore(tmp_path, 0)


def test_budget_from_the_environment(monkeypatch):
    monkeypatch.delenv(corpus_engine.RESULTS_BUDGET_ENV, raising=False)
    assert corpus_engine.results_budget() == 256_000_000
    monkeypatch.setenv(corpus_engine.RESULTS_BUDGET_ENV, "0.5")
    assert corpus_engine.results_budget() == 500_000
    for bad in ("-1", "0", "lots", "nan"):
        monkeypatch.setenv(corpus_engine.RESULTS_BUDGET_ENV, bad)
        with pytest.raises(ValueError, match="ATTNVIZ_CORPUS_RESULTS_MB"):
            corpus_engine.results_budget()


def test_a_cancelled_run_is_kept_and_counted_then_goes_first(tmp_path):
    probe = ResultsStore(tmp_path / "probe", 10**9)
    (tmp_path / "probe").mkdir()
    corpus_runs.run("minilm", texts(2), "mask", mask=MASK, resume=tmp_path / "probe" / "a.jsonl", results_store=probe)
    per_run = probe.used()                                   # the bytes of a finished 2-text run
    shutil.rmtree(tmp_path / "probe")
    store = ResultsStore(tmp_path, int(per_run * 1.5))
    seen = []
    first = tmp_path / "first.jsonl"
    part = corpus_runs.run("minilm", texts(2), "mask", mask=MASK, resume=first, results_store=store, per_task=1,
                           progress=lambda d, t, p: seen.append(store.used()), should_stop=lambda: len(seen) >= 1)
    assert not part.complete and part.done == 1
    assert first.exists() and store.used() == first.stat().st_size > 0   # kept for resume, and counted
    aged(first, 60)
    used = []
    second = tmp_path / "second.jsonl"
    corpus_runs.run("minilm", texts(2, "u"), "mask", mask=MASK, resume=second, results_store=store,
                    progress=lambda d, t, p: used.append(store.used()))
    assert max(used) <= store.max_bytes                       # within the budget at every step
    assert not first.exists() and second.exists()             # the oldest went to make room
    assert store.used() == second.stat().st_size <= store.max_bytes


def test_a_record_that_does_not_fit_is_not_written_and_runs_again_on_resume(tmp_path):
    store = ResultsStore(tmp_path, 400)
    path = tmp_path / "run.jsonl"
    done = corpus_runs.run("minilm", texts(1), "mask", mask=MASK, resume=path, results_store=store)
    assert done.complete and len(path.read_text().splitlines()) == 1     # the header fits, the record not
    assert store.used() <= 400
    again = []
    corpus_runs.run("minilm", texts(1), "mask", mask=MASK, resume=path, results_store=store,
                    progress=lambda d, t, p: again.append(d))
    assert again == [1]                                       # nothing saved, so the text ran again


def _without_write_override() -> list[str]:
    """As root, chmod does not stop writes: drop the capability that lets root ignore it."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "running as root: util-linux's setpriv is needed to drop CAP_DAC_OVERRIDE"
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]


def test_read_only_cache_without_the_model_says_what_to_run(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o555)
    try:
        env = dict(os.environ, ATTNVIZ_CACHE=str(cache), ATTNVIZ_SCHEDULER="")
        out = subprocess.run(_without_write_override() + [
            sys.executable, "-m", "attnviz.evaluate", "gtk-en", "--model", "en-pt", "--kind", "mask",
            "--mask", "2x8-f0ff", "--max-rows", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=300)
    finally:
        cache.chmod(0o755)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("error: the model 'en-pt' is not in the model cache " + str(cache)), line
    assert "deploy/warm_cache.py en-pt" in line and list(cache.iterdir()) == []


def test_a_results_file_is_named_for_any_text_even_a_lone_surrogate(tmp_path):
    from attnviz.ui import heads_corpus
    odd = Corpus(key="s.jsonl", kind="text", items=["bad \ud800 text"], labels=None, notes=[], source="t",
                 licence="t")
    first = heads_corpus.results_path(tmp_path, "minilm", odd, "mask", "6x12-fff", 0)
    assert first.suffix == ".jsonl" and first == heads_corpus.results_path(tmp_path, "minilm", odd, "mask", "6x12-fff", 0)
