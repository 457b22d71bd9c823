"""A corpus run on a real scheduler and worker processes started here, one of them killed mid-run:
a lost worker or a lost scheduler ends the run within its budget (or, with no budget, once the
cluster has had no worker for ATTNVIZ_WORKERLESS_SECONDS) with what finished and a message saying
what happened and that the finished items are kept; never a hang, never a traceback."""
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import distributed
import pytest
import torch

from attnviz.analysis import corpus_runs
from attnviz.analysis.corpus import Corpus

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply today.", "A kitten is resting on a rug.",
         "I love you very much.", "The train leaves at noon.", "Rain is expected over the hills tonight."] * 3
MASK = torch.ones(6, 12)
MASK[0, :6] = 0
CODE = corpus_runs.encode_mask(MASK > 0.5)
# a run against its budget while processes are killed: never beside a test that takes every core
pytestmark = pytest.mark.xdist_group("whole_machine")


def spawn(args, **env):
    return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **env))


@pytest.fixture
def cluster(tmp_path):
    """A scheduler and one worker (no nanny: a killed worker stays dead): (address, scheduler, worker)."""
    file = tmp_path / "scheduler.json"
    procs = [spawn(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                    "--scheduler-file", str(file)])]
    try:
        with distributed.Client(scheduler_file=str(file), timeout=60) as client:
            address = client.scheduler.address
            procs.append(spawn(["distributed.cli.dask_worker", address, "--nthreads", "1", "--no-nanny",
                                "--no-dashboard"]))
            client.wait_for_workers(1, timeout=60)
        yield address, procs[0], procs[1]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


def texts(n=len(TEXTS)):
    return Corpus(key="t", kind="text", items=TEXTS[:n], labels=None, notes=[], source="tests", licence="test")


def finished_unfetched(client) -> int:
    return sum(f.status == "finished" for f in list(client.futures.values()))


def in_thread(fn, limit: float):
    """fn() in a daemon thread: (its value or exception, seconds), or a failure after `limit` s."""
    box = {}

    def go():
        start = time.monotonic()
        try:
            box["value"] = fn()
        except BaseException as err:      # handed back to the test
            box["value"] = err
        box["seconds"] = time.monotonic() - start
    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        pytest.fail(f"the run did not end within {limit:.0f} s")
    return box["value"], box["seconds"]


def test_the_only_worker_dying_holding_finished_results_keeps_the_budget(cluster, tmp_path):
    address, _, worker = cluster
    killed = []

    def progress(done, total, partial):
        if killed:
            return
        client = distributed.default_client()     # the run's own client
        deadline = time.monotonic() + 60
        while finished_unfetched(client) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)                      # waits for a state, asserts nothing about time
        os.kill(worker.pid, signal.SIGKILL)       # dies holding results the run has not fetched yet
        killed.append(done)

    budget = 20.0
    stop = lambda start=time.monotonic(): time.monotonic() - start > budget  # noqa: E731
    got, seconds = in_thread(lambda: corpus_runs.run("minilm", texts(), "mask", mask=CODE, scheduler=address,
                                                     per_task=1, progress=progress, should_stop=stop,
                                                     resume=tmp_path / "r.jsonl"), budget + 60)
    assert not isinstance(got, BaseException), got
    assert killed and not got.complete and 1 <= got.done < got.total, (got.done, got.total, got.extra.get("stopped_note"), seconds)
    assert len(got.table) == got.done                      # what finished is shown
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 1 + got.done   # and kept for resume


def evaluate(corpus_file, address, resume, **env):
    return subprocess.Popen([sys.executable, "-m", "attnviz.evaluate", str(corpus_file), "--kind", "mask",
                             "--mask", CODE, "--scheduler", address, "--resume", str(resume)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), **env))


def run_cli_and_kill(tmp_path, address, victim):
    """The CLI over the texts; `victim` killed once the first item is reported. (status, stdout, stderr)."""
    corpus_file = tmp_path / "t.txt"
    corpus_file.write_text("\n".join(TEXTS) + "\n")
    proc = evaluate(corpus_file, address, tmp_path / "cli.jsonl", ATTNVIZ_WORKERLESS_SECONDS="3")
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("item 1/"):
                os.kill(victim.pid, signal.SIGKILL)
                break
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the CLI hung after the cluster lost its " + ("worker" if victim else "scheduler"))
    return proc.returncode, out, "".join(lines) + err


def test_the_cli_stops_with_a_message_when_its_only_worker_is_lost(cluster, tmp_path):
    address, _, worker = cluster
    status, out, err = run_cli_and_kill(tmp_path, address, worker)
    assert status == 3 and "Traceback" not in err, err
    assert "no worker" in err and "finished steps are kept in the results file" in err, err
    assert "cosine" in out                                  # the summary of what finished
    assert len((tmp_path / "cli.jsonl").read_text().splitlines()) >= 2


def test_a_lost_scheduler_is_a_message_and_the_finished_items_are_kept(cluster, tmp_path):
    address, scheduler, _ = cluster
    status, out, err = run_cli_and_kill(tmp_path, address, scheduler)
    assert status == 3 and "Traceback" not in err, err
    assert "scheduler" in err and "was lost" in err and "finished steps are kept" in err, err
    assert len((tmp_path / "cli.jsonl").read_text().splitlines()) >= 2


def test_a_lost_scheduler_in_the_library_returns_what_finished(cluster, tmp_path):
    address, scheduler, _ = cluster

    def progress(done, total, partial):
        if done == 1:
            os.kill(scheduler.pid, signal.SIGKILL)

    got, _ = in_thread(lambda: corpus_runs.run("minilm", texts(), "mask", mask=CODE, scheduler=address,
                                               per_task=1, progress=progress, resume=tmp_path / "r.jsonl"), 120)
    assert not isinstance(got, BaseException), repr(got)
    assert not got.complete and got.done >= 1 and "scheduler" in got.extra["stopped_note"]
    assert "kept in the results file" in got.extra["stopped_note"]
