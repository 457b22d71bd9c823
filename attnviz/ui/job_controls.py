"""Heavy jobs started from a page, cancelled when the browser session that started them goes away.

A long library loop (prune and measure, head scores, importance, a training) makes no Streamlit
call while it runs, so nothing stops it when its tab is closed: it would hold one of the server's
heavy-job slots (`attnviz.base.jobs.heavy_job`) until its deadline. `heavy_job(name)` here holds
the slot AND yields a `Cancel` bound to the current session: every check polls
`runtime.is_active_session(session_id)` (a dict lookup; False once the browser disconnected or
the session was closed), so the loop, which checks its Cancel between steps, gives the slot back
within one step.

    with ui_jobs.heavy_job("head scores") as cancel:
        table = head_scores(model, ..., cancel=cancel)          # objects with .check()
        result = measure_speedup(model, ..., should_stop=cancel)  # or a should_stop()

Outside a script run (plain Python, a test calling a view directly) the Cancel watches nothing;
under AppTest the runtime is a stand-in whose sessions always read as active.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from streamlit import runtime
from streamlit.runtime.scriptrunner import get_script_run_ctx

from attnviz.base import jobs

GONE = "the browser session that started this job has gone"


def session_alive(session_id: str) -> bool:
    """True while the session is connected (and when no runtime can tell: not under `streamlit run`)."""
    if not runtime.exists():
        return True
    return bool(runtime.get_instance().is_active_session(session_id))


def current_session_id() -> str | None:
    ctx = get_script_run_ctx(suppress_warning=True)
    return None if ctx is None else ctx.session_id


def session_cancel(*also) -> jobs.Cancel:
    """A Cancel that sets itself once the current browser session goes away (or any of `also`,
    zero-argument callables, returns True)."""
    session_id = current_session_id()
    if session_id is None:
        return jobs.Cancel(*also)
    return jobs.Cancel(lambda: not session_alive(session_id), *also, reason=GONE)


@contextmanager
def heavy_job(name: str, limit: int | None = None) -> Iterator[jobs.Cancel]:
    """Hold one of the server's heavy-job slots (`jobs.ServerBusy` at once when none is free) and
    yield this session's Cancel: pass it to the job's loop so a closed tab frees the slot."""
    cancel = session_cancel()
    with jobs.heavy_job(name, limit):
        yield cancel
