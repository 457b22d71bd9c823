"""A results file is input: resuming uses only records that fit the run (an item it has, every field,
numeric arrays of the model's shapes, metrics in range and equal to what their stored outputs give),
skips the rest with a note (those items run again), and never lets one line allocate gigabytes."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnviz.analysis import corpus_engine, corpus_runs
from attnviz.analysis.corpus import Corpus

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply today."]
MASK = torch.ones(6, 12)
MASK[0, :6] = 0


def texts():
    return Corpus(key="t", kind="text", items=list(TEXTS), labels=None, notes=[], source="tests", licence="test")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A finished mask run's results file (header + one record per text) and its result."""
    path = tmp_path_factory.mktemp("resume") / "run.jsonl"
    result = corpus_runs.run("minilm", texts(), "mask", mask=MASK, resume=path)
    return path.read_text().splitlines(), result


def rewrite(tmp_path, lines, edit):
    """The written file with record `i` replaced by edit(record) for each i in `edit`."""
    out = [lines[0]]
    for i, line in enumerate(lines[1:]):
        if i in edit:
            rec = json.loads(line)
            changed = edit[i](rec)
            out.append(changed if isinstance(changed, str) else json.dumps(changed))
        else:
            out.append(line)
    path = tmp_path / "tampered.jsonl"
    path.write_text("\n".join(out) + "\n")
    return path


def resumed(path):
    seen = []
    got = corpus_runs.run("minilm", texts(), "mask", mask=MASK, resume=path, progress=lambda d, t, p: seen.append((d, t)))
    return got, seen


def test_an_untouched_file_resumes_everything(tmp_path, written):
    lines, first = written
    got, seen = resumed(rewrite(tmp_path, lines, {}))
    assert seen == [] and got.complete and got.done == got.total == 2 and "resume_note" not in got.extra
    assert got.table.equals(first.table)


def test_a_record_for_an_item_the_run_does_not_have_is_not_counted(tmp_path, written):
    lines, _ = written
    extra = json.loads(lines[1])
    extra["index"] = 7
    path = rewrite(tmp_path, lines, {})
    with path.open("a") as f:
        f.write(json.dumps(extra) + "\n")
    got, _ = resumed(path)
    assert got.done == got.total == 2 and len(got.table) == 2 and got.complete
    assert "skipped 1 record" in got.extra["resume_note"]


def test_a_record_missing_a_field_runs_its_item_again(tmp_path, written):
    lines, first = written

    def drop_full(rec):
        del rec["result"]["full"]
        return rec
    got, seen = resumed(rewrite(tmp_path, lines, {0: drop_full}))
    assert seen == [(2, 2)] and got.complete and "skipped 1 record" in got.extra["resume_note"]
    assert np.allclose(got.table["cosine"], first.table["cosine"])


def test_a_fabricated_metric_is_not_shown(tmp_path, written):
    lines, first = written

    def fake(rec):
        step = next(iter(rec["result"]["steps"].values()))
        step["metrics"]["cosine"] = 3086.99
        return rec

    def in_range_but_not_its_outputs(rec):
        step = next(iter(rec["result"]["steps"].values()))
        step["metrics"]["cosine"] = 0.123
        return rec
    got, seen = resumed(rewrite(tmp_path, lines, {0: fake, 1: in_range_but_not_its_outputs}))
    assert len(seen) == 2 and "skipped 2 records" in got.extra["resume_note"]
    assert (got.table["cosine"] <= 1).all() and np.allclose(got.table["cosine"], first.table["cosine"])
    assert got.summary["value"].max() <= 1


def test_a_crafted_dtype_is_refused_before_it_allocates(tmp_path):
    header = dict(model="m", items=2)
    path = tmp_path / "r.jsonl"
    huge = {"phase": "p", "index": 0, "result": {"raw": {"__ndarray__": [0] * 35_000, "dtype": "U2500"}}}
    void = {"phase": "p", "index": 1, "result": {"raw": {"__ndarray__": [0] * 10, "dtype": "V5000"}}}
    ok = {"phase": "p", "index": 1, "result": {"raw": {"__ndarray__": [0.5, 1.5], "dtype": "float32"}}}
    path.write_text("\n".join(json.dumps(x) for x in ({"run": header}, huge, void, ok)) + "\n")
    f = corpus_engine.ResultsFile(path, header)
    assert set(f.records) == {("p", 1)} and f.skipped == 2
    assert f.records[("p", 1)]["raw"].dtype == np.float32


def test_the_cli_resumes_a_file_with_a_record_missing_a_field_without_a_traceback(tmp_path, written):
    lines, _ = written
    corpus_file = tmp_path / "t.txt"
    corpus_file.write_text("\n".join(TEXTS) + "\n")
    path = tmp_path / "cli.jsonl"
    mask = corpus_runs.encode_mask(MASK > 0.5)
    args = [sys.executable, "-m", "attnviz.evaluate", str(corpus_file), "--kind", "mask", "--mask", mask,
            "--resume", str(path)]
    first = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    recs = path.read_text().splitlines()
    broken = json.loads(recs[1])
    del broken["result"]["steps"]
    path.write_text("\n".join([recs[0], json.dumps(broken), recs[2]]) + "\n")
    again = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    assert "note: skipped 1 record" in again.stderr and "item 2/2" in again.stderr
