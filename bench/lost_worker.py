"""Time and peak memory of a corpus run whose only Dask worker dies holding finished results, under a
20 s budget: a scheduler and one worker (no nanny) are started here, the worker is killed once the
run's client sees two results it has not fetched yet. Prints one JSON line: seconds from the start
to the run's end (or to the 90 s cap, when it did not end), seconds after the kill, peak resident MB.
Usage: python bench/lost_worker.py
"""
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import distributed  # noqa: E402
import torch  # noqa: E402

from attnviz.analysis import corpus_runs  # noqa: E402
from attnviz.analysis.corpus import Corpus  # noqa: E402

BUDGET, CAP = 20.0, 90.0
TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply today.", "A kitten is resting on a rug.",
         "I love you very much.", "The train leaves at noon.", "Rain is expected over the hills tonight."] * 3


def spawn(args):
    return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"))


def main():
    folder = tempfile.mkdtemp()
    file = os.path.join(folder, "scheduler.json")
    procs = [spawn(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                    "--scheduler-file", file])]
    try:
        with distributed.Client(scheduler_file=file, timeout=60) as client:
            address = client.scheduler.address
            procs.append(spawn(["distributed.cli.dask_worker", address, "--nthreads", "1", "--no-nanny",
                                "--no-dashboard"]))
            client.wait_for_workers(1, timeout=60)
        killed, box = [], {}

        def progress(done, total, partial):
            if killed:
                return
            run_client = distributed.default_client()
            until = time.monotonic() + 60
            while sum(f.status == "finished" for f in list(run_client.futures.values())) < 2 \
                    and time.monotonic() < until:
                time.sleep(0.01)
            os.kill(procs[1].pid, signal.SIGKILL)
            killed.append(time.monotonic())

        mask = torch.ones(6, 12)
        mask[0, :6] = 0
        corpus = Corpus("t", "text", TEXTS, None, [], "bench", "bench")
        start = time.monotonic()
        stop = lambda: time.monotonic() - start > BUDGET  # noqa: E731

        def go():
            result = corpus_runs.run("minilm", corpus, "mask", mask=mask, scheduler=address, progress=progress,
                                     should_stop=stop)
            box["done"] = f"{result.done}/{result.total}"
        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        thread.join(CAP)
        end = time.monotonic()
        print(json.dumps(dict(budget_s=BUDGET, ended=not thread.is_alive(), seconds=round(end - start, 1),
                              after_kill_s=round(end - killed[0], 1) if killed else None, done=box.get("done"),
                              peak_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))),
              flush=True)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    os._exit(0)   # a run that never ended leaves its thread waiting


if __name__ == "__main__":
    main()
