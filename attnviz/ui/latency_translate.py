"""The Latency page's translation section: what translating costs against source length, split into
encoding (once per sentence) and decoding (per target token); modelled for a Raspberry Pi 4 / 5 at
once, measured on this CPU on request (`attnviz.latency.translation_latency`, also
`python -m attnviz.bench --model en-pt`)."""
from __future__ import annotations

import streamlit as st

from attnviz.base import jobs
from attnviz.base.names import session_key
from attnviz.figures import translation_figures
from attnviz.latency import translation_latency
from attnviz.ui.common import shared_model, plain

PAGE = "latency"
LENGTHS = [4, 8, 16, 32, 64, 128]


def K(name: str) -> str:
    return session_key(PAGE, f"translate_{name}")


def translation_section():
    st.subheader("Translation")
    if not st.toggle("Show what translating costs (en-pt, pt-en): encoding and per-token decoding",
                     key=K("show")):
        return
    with st.container(border=True):
        keys = [k for k in ("en-pt", "pt-en") if translation_latency.is_translator(k)]
        c1, c2 = st.columns([2, 1])
        picked = c1.multiselect("Translators", keys, default=keys[:1], key=K("models"))
        measure_here = c2.checkbox("measure on this CPU too", key=K("measure"),
                                   help="times the encoder and 16 decoding steps at each length (a few seconds)")
        if not picked:
            st.info("Pick a translator.")
            return
        backends = ["pi4", "pi5"] + (["cpu"] if measure_here else [])
        try:
            models = {k: shared_model(k) for k in picked}
            if measure_here:
                with jobs.heavy_job("a translation latency sweep"), st.spinner("Measuring…"):
                    df = translation_latency.sweep(models, LENGTHS, backends, repeats=3, warmup=1)
            else:
                df = translation_latency.sweep(models, LENGTHS, backends)
        except ValueError as err:
            st.error(plain(str(err)))
            return
        st.plotly_chart(translation_figures.translation_cost_figure(df), key=K("figure"))
        st.caption("A sentence costs one encoding plus one decoding step per target token. The SSRU decoder's "
                   "step hardly grows with the source (only cross-attention reads it); most of a step is "
                   "the output product over all 32,000 pieces, which the package's own engine cuts with a "
                   "lexical shortlist.")
