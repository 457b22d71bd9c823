"""The model picker's models by name ("org/name", "org/name@revision"): the ones already in this
server's Hugging Face cache, offered as they are, and, where the operator allows downloads
(ATTNVIZ_HUB=1, ATTNVIZ_HUB_ALLOW), "Hub model…": a typed name, sized from the Hub's file metadata
and shown before a Download button, then fetched with progress and a Cancel button.

Everything a user typed reaches the screen only through the caller's error message (escaped there);
the size line and the progress bar say sizes and a commit, never a typed name."""
from __future__ import annotations

import threading

import streamlit as st

from attnviz.base.limits import LIMITS
from attnviz.weights import hub
from attnviz.weights.folders import size_text
from attnviz.ui import job_controls

ENTRY = "Hub model…"            # the picker's entry for a typed name (offered only with ATTNVIZ_HUB=1)
NAME_KEY = "model_hub_name"     # session key of its text box
SHARED_NAME_KEY = "model_last_hub_name"
CANCELLED_KEY = "hub_download_cancelled"
PREFIX = "hub:"                 # the shared model cache's keys: "hub:org/name@<commit>"


@st.cache_data(ttl=30, max_entries=4, show_spinner=False)
def _cached(root: str) -> list[tuple[str, str]]:
    """(name, task) of the cached models (a scan of the cache folder: kept 30 s, per cache folder)."""
    return hub.cached_models()


def entries(tasks: tuple[str, ...]) -> list[str]:
    """The picker's entries: the cached models of these tasks, then "Hub model…" where allowed."""
    return [name for name, task in _cached(str(hub.cache_dir())) if task in tasks] + ([ENTRY] if LIMITS.hub else [])


def key_of(choice: str) -> str:
    """The shared model cache's key of a picker choice: a catalogue key as it is (none has a "/");
    a name at its cached commit, so a branch that moves is a new entry, or as given when it is not
    cached (loading it then says why)."""
    return PREFIX + (hub.cached_key(choice) or choice) if "/" in choice else choice


def load(key: str, shown: str):
    return hub.load_named(key[len(PREFIX):], key=shown or None, limits=LIMITS)


@st.cache_data(ttl=120, max_entries=32, show_spinner=False)
def _plan(name: str, allow: str, max_weight_bytes: int) -> hub.Plan:
    """The Hub's answer for a name, kept two minutes (each rerun would ask again); keyed on the limits
    it was checked against. A refusal (ValueError) is not kept."""
    return hub.plan(name, LIMITS)


def pick() -> str | None:
    """The "Hub model…" text box. The name to load once it is in the cache; None while it is not
    (its size and a Download button shown). ValueError: a malformed name, a refused repo or a
    failed download."""
    ss = st.session_state
    if NAME_KEY not in ss and ss.get(SHARED_NAME_KEY):
        ss[NAME_KEY] = ss[SHARED_NAME_KEY]
    typed = st.text_input("Hugging Face model", key=NAME_KEY, placeholder="org/name or org/name@revision",
                          help="read from this server's Hugging Face cache, or downloaded (safetensors only) "
                               f"where its operator allows: {LIMITS.hub_allow.strip() or 'nothing yet'}").strip()
    ss[SHARED_NAME_KEY] = typed
    if not typed:
        st.info("Type a model name such as org/name (optionally @branch or @commit).")
        return None
    hub.parse(typed)
    if hub.cached_key(typed):
        return typed
    plan = _plan(typed, LIMITS.hub_allow, LIMITS.max_weight_bytes)
    if ss.pop(CANCELLED_KEY, False):
        st.warning("The download was stopped. What it fetched stays in the cache: Download resumes it.")
    st.caption(f"Not in this server's cache yet: {plan.describe()}; the limit is "
               f"{size_text(LIMITS.max_weight_bytes)} of weights.")
    if not st.button("Download", key="hub_download"):
        return None
    download(plan)
    _cached.clear()
    return typed


def download(plan: hub.Plan):
    """Fetch `plan` in a worker thread while this run draws its progress. A click on Cancel (any
    widget: it interrupts this run at its next redraw) or a closed tab sets the download's Cancel,
    which stops it at its next progress report; what was fetched stays for a later try to resume."""
    total, state = max(plan.total_bytes, 1), {"done": 0}

    def work(cancel):
        try:
            hub.download(plan, progress=lambda done, _total: state.update(done=done), cancel=cancel)
        except ValueError as err:
            state["error"] = err
        except Exception as err:  # anything else a transfer raises: a message, never a traceback
            state["error"] = ValueError(f"the download failed ({type(err).__name__}); try again")

    with job_controls.heavy_job("a model download") as cancel:
        stop = st.empty()
        stop.button("Cancel", key="hub_cancel")
        bar = st.progress(0.0, text="Starting the download…")
        worker = threading.Thread(target=work, args=(cancel,), name="attnviz-hub-download", daemon=True)
        worker.start()
        try:
            while worker.is_alive():
                worker.join(0.25)
                bar.progress(min(1.0, state["done"] / total),
                             text=f"Downloading: {size_text(state['done'])} of {size_text(plan.total_bytes)}")
        except BaseException:   # the Cancel click's rerun (or any widget's) stops this run here
            cancel.set()
            st.session_state[CANCELLED_KEY] = True
            raise
        stop.empty()
        bar.empty()
    if "error" in state:
        raise state["error"]
