"""The shared models of this server: one copy of each for every session, kept within a byte
budget (LIMITS.model_cache_mb), the least recently used dropped first when a new one would not
fit, and what the loading message says about them (which are held, their memory, the budget).

Streamlit's st.cache_resource bounds only the number of entries, so a walk through the pages
(seven bundled models, 2.3 GB together) reloaded models that memory had room for; this cache
bounds what actually costs: the bytes of the weights and their prepacked copies."""
from __future__ import annotations

import threading

import streamlit as st

from attnviz.base.lru import LRU
from attnviz.base.limits import LIMITS

_MAX_MODELS = 64   # the byte budget is the bound; the count only keeps the map small


def model_bytes(model) -> int:
    """The memory a loaded model holds: its parameters, buffers and prepacked linear copies
    (core.blocks.Linear.pack: a second copy of most weights, laid out for oneDNN)."""
    net = model.net
    tensors = list(net.parameters()) + list(net.buffers())
    tensors += [m._packed for m in net.modules() if getattr(m, "_packed", None) is not None]
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors)


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
