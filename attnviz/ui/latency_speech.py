"""The Latency page's speech section: what transcribing costs with Whisper, split into one encoding
of a fixed 30 s window (1,500 audio frames, however short the speech) and one decoding step per text
token; modelled for a Raspberry Pi 4 / 5 per engine at once, measured on this CPU on request
(`attnviz.latency.speech_latency`, also `python -m attnviz.bench --model whisper-tiny-en`)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from attnviz.base import jobs
from attnviz.base.names import session_key
from attnviz.latency import speech_latency
from attnviz.latency.engines import ENGINE_DTYPES, ENGINES
from attnviz.ui.common import shared_model, plain

PAGE = "latency"
KEY = "whisper-tiny-en"


def K(name: str) -> str:
    return session_key(PAGE, f"speech_{name}")


def cost_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (backend, engine, dtype, threads): encoding ms, ms per token, a 30 s window with
    `tokens` tokens (about 100 for 30 s of speech), and the published encoder run where there is one."""
    keys = ["backend", "engine", "dtype", "threads"]
    enc = df[df["phase"] == "encode"].set_index(keys)
    dec = df[df["phase"] == "decode"].set_index(keys)
    out = pd.DataFrame({"encode ms (30 s window)": enc["ms"], "decode ms / token": dec["ms"]})
    out["window + 100 tokens, s"] = (out["encode ms (30 s window)"] + 100 * out["decode ms / token"]) / 1e3
    out["published encode ms"] = enc["published_ms"]
    return out.reset_index()


def speech_section():
    st.subheader("Speech (Whisper)")
    if not st.toggle("Show what transcribing costs (whisper-tiny-en): a 30 s encoding and per-token decoding",
                     key=K("show")):
        return
    if not speech_latency.is_speech(KEY):
        st.info(f"{KEY} is not bundled here.")
        return
    with st.container(border=True):
        c1, c2 = st.columns([2, 1])
        engines = c1.multiselect("Pi engines", list(ENGINES), default=["torch", "ggml"], key=K("engines"),
                                 format_func=lambda e: f"{e}: {ENGINES[e]}")
        measure_here = c2.checkbox("measure on this CPU too", key=K("measure"), help="times the encoder on "
                                   "a 30 s window and 16 decoding steps, twice each (several seconds)")
        if not engines:
            st.info("Pick an engine.")
            return
        dtypes = list(dict.fromkeys(d for e in engines for d in ENGINE_DTYPES[e]))  # each engine at its dtypes
        backends = ["pi4", "pi5"] + (["cpu"] if measure_here else [])
        try:
            models = {KEY: shared_model(KEY)}
            if measure_here:
                with jobs.heavy_job("a Whisper latency measurement"), st.spinner("Measuring…"):
                    df = speech_latency.sweep(models, backends, engines, dtypes, repeats=1, warmup=1)
            else:
                df = speech_latency.sweep(models, backends, engines, dtypes)
        except ValueError as err:
            st.error(plain(str(err)))
            return
        st.dataframe(cost_table(df), hide_index=True, key=K("table"),
                     column_config={c: st.column_config.NumberColumn(format="%.1f")
                                    for c in ("encode ms (30 s window)", "decode ms / token",
                                              "published encode ms")}
                     | {"window + 100 tokens, s": st.column_config.NumberColumn(format="%.2f")})
        st.caption("Whisper always encodes 30 s (silence included), so the encoding is one fixed cost per "
                   "window; decoding then costs one step per text token, each reading all 1,500 audio frames "
                   "through cross-attention and scoring 51,864 tokens. The ggml rows are anchored on "
                   "whisper.cpp's published Pi 4 and Pi 5 encoder runs (bench, 4 threads); the rest are modelled.")

