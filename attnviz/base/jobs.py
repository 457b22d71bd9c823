"""Bounds on long work, shared by every page and browser session of one server process.

- `heavy_job(name)`: at most `LIMITS.max_heavy_jobs` heavy jobs (importance runs, sweeps, toy
  trainings, long captures) run at once in the process; one more is refused at once with
  `ServerBusy` (a ValueError, so pages show it like any other bad request) instead of queueing
  behind the others with no word said. So is one that would take the process past its memory
  budget (`base.memory.check_room`).
- `Deadline(seconds)`: a hard stop checked between steps of a job (`check()` raises `JobTimeout`).
- `Cancel`: a flag another rerun can set, or conditions it polls (e.g. "the browser session that
  started the job has gone": `attnviz.ui.job_controls`); `check()` raises `JobCancelled`, and calling it
  answers "should I stop?" for loops that end early with a partial result instead.

Every heavy loop checks its Cancel (and Deadline) between steps, so a job whose user has gone
gives its slot back within one step instead of at its deadline.

Everything here is plain Python (no streamlit): the pages wrap it with messages.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable

from attnviz.base import memory
from attnviz.base.limits import LIMITS


class ServerBusy(ValueError):
    """Too many heavy jobs are running on this server."""


class JobTimeout(ValueError):
    """A job ran past its deadline."""


class JobCancelled(ValueError):
    """The user cancelled a job."""


_lock = threading.Lock()
_running: dict[int, str] = {}   # id -> job name
_next_id = 0


def running_jobs() -> list[str]:
    with _lock:
        return list(_running.values())


@contextmanager
def heavy_job(name: str, limit: int | None = None, need_bytes: float = 0):
    """Hold one of the server's heavy-job slots for the block, or raise ServerBusy at once; a job
    that would take the process past its memory budget (`memory.check_room`, with the `need_bytes`
    it is estimated to need) is refused the same way, before it starts."""
    global _next_id
    limit = LIMITS.max_heavy_jobs if limit is None else limit
    memory.check_room(name, need_bytes)
    with _lock:
        if limit > 0 and len(_running) >= limit:
            # Only that the server is busy: what other users run is theirs.
            raise ServerBusy(f"the server is busy: it is already running as many heavy jobs as it takes "
                             f"(at most {limit} at once). Try {name} again in a moment.")
        _next_id += 1
        job_id = _next_id
        _running[job_id] = name
    try:
        yield
    finally:
        with _lock:
            _running.pop(job_id, None)


class Deadline:
    """`Deadline(60).check()` raises JobTimeout once 60 s have passed since it was made."""

    def __init__(self, seconds: float | None, what: str = "this job"):
        self.seconds = seconds
        self.what = what
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    @property
    def remaining(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - self.elapsed

    def expired(self) -> bool:
        return self.remaining <= 0

    def check(self):
        if self.expired():
            raise JobTimeout(f"{self.what} stopped at its time limit of {self.seconds:g} s")


class Cancel:
    """A cancellation flag: set() from anywhere, check() inside the job's loop.

    `Cancel(*stop_when)`: each `stop_when()` is polled by every check (cheap calls only: a dict
    lookup); once one returns True the flag stays set. `reason` is the JobCancelled message.
    A Cancel is also a `should_stop` (calling it returns whether the job should stop)."""

    def __init__(self, *stop_when: Callable[[], bool], reason: str = "cancelled"):
        self._event = threading.Event()
        self._stop_when = stop_when
        self.reason = reason

    def set(self):
        self._event.set()

    def is_set(self) -> bool:
        if not self._event.is_set() and any(stop() for stop in self._stop_when):
            self._event.set()
        return self._event.is_set()

    __call__ = is_set

    def check(self):
        if self.is_set():
            raise JobCancelled(self.reason)


def checks(*stops) -> Callable[[], None]:
    """One `check()` for several Deadline / Cancel objects (None entries are skipped)."""
    active = [s for s in stops if s is not None]

    def check():
        for stop in active:
            stop.check()
    return check
