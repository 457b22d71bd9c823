"""The shared part of every page: cached loaders, the sidebar model picker, the remembered view
choice, byte-bounded result caches, downloads and small session-state helpers."""
from __future__ import annotations

import gc
import os
import re
import time
from pathlib import Path

import streamlit as st
from streamlit.errors import StreamlitPageNotFoundError

from attnviz.base import names
from attnviz.base.lru import LRU
from attnviz.base.limits import LIMITS
from attnviz.core.model import Model
from attnviz.figures import render
from attnviz.toys.tasks import TOYS
from attnviz.weights import catalogue
from attnviz.weights import allowed
from attnviz.weights.catalogue import BUNDLED, DEFAULT_MODEL
from attnviz.ui import first_load, hub_picker, loaded_models, shared_view

if LIMITS.torch_threads > 0:  # once per server process, before any model runs
    import torch
    torch.set_num_threads(LIMITS.torch_threads)

MODEL_KEY = "model_choice"      # session key of the sidebar's model picker
CUSTOM_KEY = "model_custom_dir"  # session key of the local-folder text box
SHARED_KEY = "model_last"          # the last model picked on any page (not a widget key)
SHARED_CUSTOM_KEY = "model_last_dir"


_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")


def plain(text: str) -> str:
    """Text a user supplied (file names, paths, CSV cells inside error messages), escaped so that
    Streamlit's markdown shows it as typed: no links, images or formatting from user input."""
    return _MARKDOWN.sub(r"\\\1", str(text))


# A timing is not known to a hundredth of a millisecond on a busy CPU: every table shows
# milliseconds to three significant figures (127, 12.7, 1.27), as sentences do (`base.numbers.ms`).
MS_FORMAT = "%.3g"


def ms_columns(columns) -> dict:
    """column_config for a table's millisecond columns (named *_ms, or *_ms_q1 / *_ms_q3)."""
    return {c: st.column_config.NumberColumn(c, format=MS_FORMAT, help="milliseconds")
            for c in columns if str(c).endswith("_ms") or "_ms_" in str(c)}


LOCAL = "local folder…"  # the picker's entry for a typed folder (offered only with an allow-list)


def _shared_model(key: str, _typed: str = "") -> Model:
    """One shared, never-mutated model per key for every session, within the model budget
    (ui.loaded_models). `key`: a catalogue key, "hub:" + a name at its commit, or "folder:" + a RESOLVED
    allowed folder, so every spelling of one folder (`/m/big/`, `/m/./big`, a symlink) is one copy."""
    return loaded_models.shared(key, lambda: _load(key, _typed))


def _load(key: str, typed: str) -> Model:
    if key.startswith("folder:"):   # an allowed folder or .gguf file, resolved
        model = catalogue.load_allowed_path(Path(key[len("folder:"):]), typed)
    else:  # a catalogue key, or a name from the Hugging Face cache ("hub:org/name@<commit>")
        model = hub_picker.load(key, typed) if key.startswith(hub_picker.PREFIX) else catalogue.load_model(key)
    settle_heap()
    return model


def settle_heap():
    """Streamlit runs a full garbage collection after every script run, and with torch,
    transformers and a model loaded that walks ~400,000 objects: ~250 ms, holding the GIL, so the
    run's last messages wait for it (a quarter of a head toggle's 1 s, bench/toggle_latency.py).
    Freezing what is alive now (modules, loaded models) takes those objects out of every later
    collection; they are still freed by reference counting when dropped (a loaded, dropped SmolLM2
    gives its memory back), only cyclic garbage among them would stay."""
    gc.collect()
    gc.freeze()


def shared_model(key: str) -> Model:
    """A model of the catalogue (bundled or toy) or a name of the Hugging Face cache ("org/name", read
    by name only), shared by every session. Never a path: typed folders go through `load_folder`."""
    if key not in BUNDLED and key not in TOYS and "/" not in key:
        raise ValueError(f"unknown model {key!r}")
    return _shared_model(key) if "/" not in key else _shared_model(hub_picker.key_of(key), key)


def folder_key(typed: str) -> str:
    """The cache key of a typed local folder or .gguf file, only inside ATTNVIZ_ALLOWED_MODEL_DIRS
    (none without one). Refusals say the same for a path outside the list, a missing one and an
    unreadable one, and never show where a path resolves."""
    return f"folder:{allowed.allowed_path(typed, LIMITS)}"


def load_folder(typed: str) -> Model:
    """A typed local folder (see `folder_key`), cached on its resolved path."""
    return _shared_model(folder_key(typed), typed)


def loaded_with_status(notice, choice: str, typed: str | None) -> Model:
    """Load the picked model. A load that is not in memory (seconds: reading, and on a new server
    converting, the weights) shows in the main area what is loading, how long it took and what the
    server holds against its model budget; a held model is taken at once."""
    key = folder_key(typed) if typed is not None else hub_picker.key_of(choice)
    if typed is None and key not in BUNDLED and key not in TOYS and not key.startswith(hub_picker.PREFIX):
        raise ValueError(f"unknown model {key!r}")
    if loaded_models.holds(key):
        return _shared_model(key, typed or choice)
    with notice.status(plain(f"Loading {choice}…"), expanded=True) as status:
        st.write(plain(first_load.expected(key) or f"Reading {choice}'s weights into memory. The first start of a "
                       "server also converts them to this app's format and caches them on disk; every "
                       "later page and session shares this one copy."))
        start = time.perf_counter()
        try:
            with loaded_models.stages(loaded_models.stage_bar()):
                model = _shared_model(key, typed or choice)
        except ValueError:
            status.update(label=plain(f"Could not load {choice}"), state="error")
            raise
        status.update(label=plain(f"Loaded {choice} in {time.perf_counter() - start:.1f} s: "
                                  f"{model.num_params() / 1e6:.1f} M parameters"),
                      state="complete", expanded=False)
        st.caption(plain(loaded_models.note(key, typed or choice)))
    return model


def forget_loaded():
    """Drop the shared models (tests: the next open is a first open again)."""
    loaded_models.clear()


def local_folders_allowed() -> bool:
    return bool(LIMITS.allowed_model_dirs.strip())


def model_picker(tasks: tuple[str, ...] = ("encoder", "lm", "vision"), default: str | None = None,
                 nav: bool = True):
    """Sidebar: bundled models of the given tasks, Hugging Face models by name (ui.hub_picker), and a
    typed local HF folder when the deployment allows some (ATTNVIZ_ALLOWED_MODEL_DIRS). Model or None.
    `nav=False`: the page drew the sidebar's links already."""
    infos = [m for m in catalogue.list_models() if m.task in tasks]
    keys = [m.key for m in infos] + hub_picker.entries(tasks) + ([LOCAL] if local_folders_allowed() else [])
    if not keys:   # nothing bundled of these tasks, none cached, no downloads and no folders allowed
        st.info(f"No {' or '.join(tasks)} model is available on this server: none is in its Hugging Face cache, "
                "and its operator allows neither downloads (ATTNVIZ_HUB) nor local folders "
                "(ATTNVIZ_ALLOWED_MODEL_DIRS).")
        return None
    default = default or (DEFAULT_MODEL if DEFAULT_MODEL in keys else keys[0])
    page_key = f"{MODEL_KEY}:{'/'.join(tasks)}"
    # Streamlit forgets a widget's state when a page that lacks it runs, so the last choice is
    # also kept under plain keys: every page's picker opens on the model picked elsewhere.
    if st.session_state.get(SHARED_KEY) in keys and page_key not in st.session_state:
        default = st.session_state[SHARED_KEY]
    st.session_state.setdefault(page_key, default)
    if CUSTOM_KEY not in st.session_state and st.session_state.get(SHARED_CUSTOM_KEY):
        st.session_state[CUSTOM_KEY] = st.session_state[SHARED_CUSTOM_KEY]
    if st.session_state[page_key] not in keys:
        st.session_state[page_key] = default
    notice = st.empty()    # the main area's loading status (the sidebar's spinner is easy to miss)
    if nav:
        sidebar_nav()
    with st.sidebar:
        choice = st.selectbox("Model", **shared_view.linked(
            page_key, format_func=lambda k: k if k not in BUNDLED else f"{k} ({BUNDLED[k]['family']})", options=keys))
        st.session_state[SHARED_KEY] = choice
        typed = None
        if choice == LOCAL:
            roots = ", ".join(e.strip() for e in LIMITS.allowed_model_dirs.split(os.pathsep) if e.strip())
            typed = st.text_input("Model folder or .gguf file", key=CUSTOM_KEY,
                                  placeholder="config.json + model.safetensors, or a .gguf file",
                                  help=f"a folder under {roots} (a name relative to it works too)").strip()
            st.session_state[SHARED_CUSTOM_KEY] = typed
            if not typed:
                st.info(plain(f"Type the name of a model folder, or a .gguf file, under {roots}."))
                return None
            choice = typed
        try:
            if choice == hub_picker.ENTRY and (choice := hub_picker.pick()) is None:
                return None
            model = loaded_with_status(notice, choice, typed)
        except ValueError as err:
            st.error(plain(err))
            return None
        if model.cfg.task not in tasks:
            st.error(plain(f"{choice} is a {model.cfg.task} model; this page needs one of: {', '.join(tasks)}."))
            return None
        show_shape(model)
    return model


@st.cache_data(max_entries=8, show_spinner=False, ttl=60)
def _fingerprint(key: str, _model: Model) -> str:
    return _model.fingerprint()


def model_digest(model: Model) -> str:
    return _fingerprint(f"{model.info.key}@{id(model)}", model)


def loaded_model(model: Model):
    """The home page's summary of the picked model: its shape and its weights' fingerprint."""
    c = model.cfg
    st.subheader(f"Loaded: {plain(model.info.key)}")
    cols = st.columns(4)
    cols[0].metric("Layers", c.n_layers)
    cols[1].metric("Heads", c.n_heads)
    cols[2].metric("K/V heads", c.n_kv_heads)
    cols[3].metric("Image size" if c.is_vision else "Positions",
                   f"{model.image_size} px" if c.is_vision else f"{c.max_positions:,}")
    with st.expander("Weights fingerprint"):
        st.caption("SHA-256 of every parameter of the model this server shares between all "
                   "sessions; it never changes while the server runs.")
        st.code(model_digest(model), language=None)


def show_shape(model: Model):
    c = model.cfg
    st.caption(f"**{plain(model.info.key)}** · {c.family} · {c.n_layers} layers × {c.n_heads} heads"
               f" ({c.n_kv_heads} K/V) · d_model {c.d_model} · "
               f"{'image ' + str(model.image_size) + ' px' if c.is_vision else str(c.max_positions)}"
               f"{'' if c.is_vision else ' frames' if c.is_audio else ' positions'}"
               f" · {model.num_params() / 1e6:.1f} M params")


def picked_cell(chart_key: str, n_columns: int = 0) -> tuple[int, int] | None:
    """(row, column) of the point clicked in a plotly chart drawn with on_select="rerun" and
    customdata [row, column, ...] (e.g. viz.overview_figure: [layer, head, ...]); None if none."""
    state = st.session_state.get(chart_key)
    try:
        points = state["selection"]["points"]
    except (KeyError, TypeError):
        return None
    if not points:
        return None
    data = points[0].get("customdata")
    try:
        if data is not None and len(data) >= 2:
            return int(data[0]), int(data[1])
        if n_columns:   # some Streamlit versions omit customdata: points are laid out row-major
            index = int(points[0].get("point_index", points[0].get("point_number")))
            return divmod(index, n_columns)
    except (TypeError, ValueError):
        pass
    return None


def clickable_overview(figure):
    """Make `viz.overview_figure` clickable in Streamlit: its transparent hover heatmap gets a
    twin of invisible scatter markers (Streamlit's on_select reports scatter points, but not
    heatmap cells), with the same [layer, head, text] customdata, row-major."""
    import numpy as np
    import plotly.graph_objects as go

    cells = figure.data[1]
    xs, ys = np.asarray(cells.x), np.asarray(cells.y)
    custom = np.asarray(cells.customdata, dtype=object)                # (L, H, 3)
    grid_x, grid_y = np.meshgrid(xs, ys)                               # (L, H) each
    pitch = float(ys[1] - ys[0]) if len(ys) > 1 else float(xs[1] - xs[0]) if len(xs) > 1 else 40.0
    # Marker sizes are screen pixels: the image is drawn height-first (scaleanchor), so one image
    # pixel is about plot height / image height screen pixels. Squares cover ~95 % of a cell.
    margin = figure.layout.margin
    plot_height = (figure.layout.height or 450) - (margin.t or 0) - (margin.b or 0)
    screen_per_pixel = plot_height / (pitch * len(ys))
    figure.add_trace(go.Scatter(
        x=grid_x.ravel(), y=grid_y.ravel(), customdata=custom.reshape(-1, custom.shape[-1]),
        mode="markers", marker=dict(symbol="square", size=max(6.0, 0.95 * pitch * screen_per_pixel),
                                    color="rgba(0,0,0,0)"),
        hovertemplate=cells.hovertemplate, showlegend=False))
    figure.data[1].hoverinfo = "skip"
    figure.update_layout(clickmode="event+select")
    return figure


def figure_downloads(name: str, matrix, xlabels: list[str], ylabels: list[str], title: str,
                     key: str, causal: bool = False, file_name: str | None = None):
    """PNG and SVG download buttons of a heatmap; the bytes are made only when clicked, and the
    click does not rerun the page (on_click="ignore"), so the view stays as it is. ``matrix``
    may be a function that makes it (then it, too, is made only on a click)."""
    made = matrix if callable(matrix) else (lambda: matrix)
    left, right = st.columns(2)
    stem = file_name or key   # file_name: what it shows (base.exports.file_stem: model, text, head)
    left.download_button(f"{name} PNG", lambda: render.figure_png(made(), xlabels, ylabels, title, causal=causal),
                         file_name=f"{stem}.png", mime="image/png", key=f"{key}_png",
                         on_click="ignore")
    right.download_button(f"{name} SVG", lambda: render.figure_svg(made(), xlabels, ylabels, title, causal=causal),
                          file_name=f"{stem}.svg", mime="image/svg+xml", key=f"{key}_svg",
                          on_click="ignore")


# ---------------------------------------------------------------- views, caches, session state
def view_choice(page: str, views: list[str], label: str = "View") -> str:
    """The one view of a page that is drawn and computed (st.tabs would run every tab's work on
    every rerun). A keyed radio whose value persists for the session: buttons, downloads, a page
    switch and back all keep it, where a tab jumped back to the first one."""
    key = names.session_key(page, "view")
    if st.session_state.get(key) not in views:
        st.session_state[key] = views[0]
    return st.radio(label, horizontal=True, label_visibility="collapsed", **shared_view.linked(key, options=views))


@st.cache_resource(show_spinner=False)
def shared_cache(name: str, max_entries: int, max_mb: float) -> LRU:
    """One LRU per `name` for the whole server: every session's per-input results of one kind,
    bounded in entries and in bytes together (not per user)."""
    return LRU(max_entries, int(max_mb * 2**20))


def cached_result(cache: LRU, key, make):
    """`cache[key]`, made (and kept if it fits the byte bound) on a miss."""
    value = cache.get(key)
    if value is None:
        value = make()
        cache.put(key, value)
    return value


def follow_owner(owner_key: str, owner, defaults: dict):
    """Widget values that belong to ``owner`` (a text, a head) are set to ``defaults`` when the
    owner changes. Assigned, never popped: the browser is told the new value. On a session's
    first run a value that came in the page's link (a `kept` input after a reload) wins over
    its default."""
    ss = st.session_state
    if ss.get(owner_key) != owner:
        first = owner_key not in ss
        ss.update({k: v for k, v in defaults.items() if not (first and k in st.query_params)})
        ss[owner_key] = owner


def keep_in_options(choices: dict):
    """{key: (options, default)}: a value that is not among the options is set to the default."""
    for state_key, (options, default) in choices.items():
        if st.session_state.get(state_key) not in options:
            st.session_state[state_key] = default


def selected_rows(table_key: str) -> list[int]:
    """Rows selected in an st.dataframe drawn with on_select="rerun" (none when unreadable)."""
    try:
        return [int(r) for r in st.session_state[table_key]["selection"]["rows"]]
    except (KeyError, TypeError, ValueError):
        return []


def clear_selection(table_key: str):
    st.session_state[table_key] = {"selection": {"rows": [], "columns": [], "cells": []}}


# ---------------------------------------------------------------- the home page's page list
# (page name, what it shows in one line); each gets a schematic thumbnail (viz.page_thumbnail).
PAGES = [
    ("Attention", "paste text: every layer × head at a glance, a head in detail, token-to-token "
                  "lines, statistics and roles, rollout, the model's own output, exports."),
    ("Heads", "switch heads off, watch outputs change, rank heads, prune for real."),
    ("Images", "what each vision head looks at in a photo."),
    ("Latency", "what attention costs as sequences grow, here and on a Raspberry Pi."),
    ("Lab", "attention step by step, positional encodings, variants, toy transformers."),
    ("Translate", "a translation model's cross-attention: which source words each output word reads."),
    ("Speech", "Whisper's text tokens attending to the audio, and word timestamps from those heads."),
    ("Readouts", "what the model believes at each layer, which heads wrote the prediction."),
]
NAV_ICONS = dict(Home="home", Attention="visibility", Heads="toggle_on", Images="image", Latency="speed",
                 Lab="science", Translate="translate", Speech="mic", Readouts="insights")


def sidebar_nav():
    """The sidebar's page links, drawn first on every page (model_picker calls it; so do pages
    without one). Streamlit's own list (off: client.showSidebarNavigation) names Home "app" after
    app.py. A page run on its own, outside the app (AppTest of one file), has nothing to link to."""
    links = [("app.py", "Home")] + [(f"pages/{n}_{name}.py", name) for n, (name, _) in enumerate(PAGES, 1)]
    with st.sidebar:
        for path, label in links:
            try:
                st.page_link(path, label=label, icon=f":material/{NAV_ICONS[label]}:")
            except StreamlitPageNotFoundError:
                return
        st.divider()
