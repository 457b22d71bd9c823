"""The shared models of this server: one copy of each for every session, kept within a byte
budget (LIMITS.model_cache_mb), the least recently used dropped first when a new one would not
fit, and what the loading message says about them (which are held, their memory, the budget).

Streamlit's st.cache_resource bounds only the number of entries, so a walk through the pages
(seven bundled models, 2.3 GB together) reloaded models that memory had room for; this cache
bounds what actually costs: the bytes of the weights and their prepacked copies."""
from __future__ import annotations

import logging
import threading
from contextlib import contextmanager

import streamlit as st

from attnviz.base.lru import LRU
from attnviz.base.limits import LIMITS
from attnviz.weights import conversion_cache

_MAX_MODELS = 64   # the byte budget is the bound; the count only keeps the map small


def model_bytes(model) -> int:
    """The memory a loaded model holds: its parameters, buffers and prepacked linear copies
    (core.blocks.Linear.pack: a second copy of most weights, laid out for oneDNN, and the float16
    grids of those packed with half=True)."""
    net = model.net
    tensors = list(net.parameters()) + list(net.buffers())
    tensors += [m._packed for m in net.modules() if getattr(m, "_packed", None) is not None]
    halves = sum(m._half.nbytes() for m in net.modules() if getattr(m, "_half", None) is not None)
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors) + halves


def budget_bytes() -> int:
    return max(1, int(LIMITS.model_cache_mb * 2**20))   # 0: keep none


@st.cache_resource(show_spinner=False)
def _models() -> LRU:
    """The server's one model map (inside cache_resource, so clearing Streamlit's caches, as a
    test does for a fresh server, drops the models too)."""
    return LRU(_MAX_MODELS, budget_bytes(), sizeof=model_bytes)


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def shared(key: str, load):
    """The shared model under `key`, made by `load()` on a miss. Sessions asking for one key at
    once wait for one load (a lock per key); other keys load side by side. A model larger than
    the whole budget is returned but not kept (the message says so)."""
    cache = _models()
    model = cache.get(key)
    if model is not None:
        return model
    with _LOCKS_LOCK:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        model = cache.get(key)
        if model is None:
            model = load()
            cache.resize(max_bytes=budget_bytes())   # LIMITS may have been overridden since
            cache.put(key, model)
    return model


def holds(key: str) -> bool:
    return key in _models()


def clear():
    _models().clear()


def note(key: str, shown: str | None = None) -> str:
    """What is held, newest first, against the budget (plain text: escape it before markdown).
    `shown` is how the just-loaded model is named to the user (a typed folder, not its path)."""
    cache = _models()
    held = cache.sizes()                                   # least recently used first
    budget = cache.max_bytes or budget_bytes()
    names = ", ".join(f"{shown if k == key and shown else k} ({b / 2**20:,.0f} MB)" for k, b in reversed(held))
    used = sum(b for _, b in held)
    text = (f"In memory on this server: {names or 'nothing'}; {used / 2**20:,.0f} MB of a "
            f"{budget / 2**20:,.0f} MB model budget (ATTNVIZ_MODEL_CACHE_MB).")
    if key not in dict(held):
        return text + (f" {shown or key} is larger than the whole budget: it is not kept, "
                       "so every page that needs it loads it again.")
    if len(held) > 1 and used > 0.75 * budget:
        text += (f" A model that does not fit in what is left drops {held[0][0]} first, which then "
                 "loads again when a page needs it.")
    return text


class _Stages(logging.Handler):
    """Calls `show(stage, message)` for the conversion cache's stage records of one thread (the
    loading session's: another session's load at the same time is not shown here)."""

    def __init__(self, show):
        super().__init__(logging.INFO)
        self.show, self.thread = show, threading.get_ident()

    def emit(self, record):
        stage = getattr(record, "stage", None)
        if stage in conversion_cache.STAGES and record.thread == self.thread:
            self.show(stage, record.getMessage())


@contextmanager
def stages(show):
    """Within the block, `show(stage, message)` is called as this thread's load reads, converts
    and caches weights (weights.conversion_cache.STAGES, in that order)."""
    logger = conversion_cache.log
    handler, level = _Stages(show), logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
        show("loaded", "")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# how far a load is at the start of each stage, and what the bar says (never a path: the
# messages name only catalogue keys, and a typed folder is not converted)
_BAR = dict(reading=(0.1, "Reading the converted weights from the disk cache…"),
            converting=(0.2, "Converting the checkpoint to this app's format (first start of this server)…"),
            caching=(0.8, "Caching the conversion on disk for the next start…"), loaded=(1.0, "Loaded."))


def stage_bar():
    """A progress bar in the current container and the `show` that `stages` calls for it."""
    bar = st.progress(0.0, text="Starting…")

    def show(stage, _message):
        bar.progress(*_BAR[stage][:1], text=_BAR[stage][1])
    return show
