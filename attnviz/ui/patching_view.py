"""The Readouts page's activation-patching view: a clean and a corrupted prompt, the recovered
logit difference per head output / Q / K / V group / residual position, as heatmaps and CSV."""
from __future__ import annotations

import streamlit as st

from attnviz.analysis import patching
from attnviz.base import exports, jobs
from attnviz.base.limits import LIMITS
from attnviz.figures import patching_figures
from attnviz.ui import job_controls, kept_inputs, shared_view

CONVENTIONS = ("TransformerLens's conventions: the metric is logit[target] - logit[minus] at the last "
               "position; each cell is one activation of the corrupted run replaced by the clean run's, "
               "scored (patched - corrupted) / (clean - corrupted): 0 changes nothing, 1 restores the clean "
               "run. Head outputs and Q per query head, K and V per K/V group (GQA), residual = block input "
               "at one position.")


def view(model, page: str):
    key = (lambda name: f"{page}.patch_{name}")
    st.caption(CONVENTIONS)
    st.session_state.setdefault(key("clean"), patching.SAMPLE_CLEAN)
    st.session_state.setdefault(key("corrupted"), patching.SAMPLE_CORRUPTED)
    st.session_state.setdefault(key("target"), " Mary")
    st.session_state.setdefault(key("minus"), " John")
    clean = st.text_input("Clean prompt", **shared_view.linked(key("clean"), kept_inputs.LINK_CHARS))
    corrupted = st.text_input("Corrupted prompt", **shared_view.linked(key("corrupted"), kept_inputs.LINK_CHARS))
    left, right = st.columns(2)
    target = left.text_input("Target token", **shared_view.linked(key("target"), 100))
    minus = right.text_input("Minus token", **shared_view.linked(key("minus"), 100))
    kind = st.radio("Patch", list(patching.KIND_NAMES), horizontal=True,
                    **shared_view.linked(key("kind"), format_func=patching.KIND_NAMES.get))
    pair = patching.prepare(model, clean, corrupted, target, minus)
    st.write(f"Clean logit difference {pair.clean_diff:.4f}; corrupted {pair.corrupted_diff:.4f}; "
             f"{patching.count(model, kind, pair)} patched runs.")
    asked = (model.info.key, clean, corrupted, pair.target, pair.minus, kind)
    kept = st.session_state.get(key("result"))
    if st.button("Run patching", key=key("run")):
        bar = st.progress(0.0, text="patching")
        # the heavy-job slot is the library's; this session's Cancel and a deadline bound it
        check = jobs.checks(job_controls.session_cancel(),
                            jobs.Deadline(LIMITS.max_importance_seconds, "activation patching"))
        result = patching.patch_map(model, pair, kind, check=check,
                                    progress=lambda d, t: bar.progress(d / t, text=f"patched {d} of {t}"))
        st.session_state[key("result")] = kept = (asked, result)
    if kept is None or kept[0] != asked:
        return
    result = kept[1]
    st.plotly_chart(patching_figures.patch_heatmap(result.recovered, result.columns,
                                                   f"recovered fraction: {patching.KIND_NAMES[kind]}"),
                    key=key("map"))
    st.write("Top: " + ", ".join(f"L{layer} {result.columns[c]} {v:.3f}" for layer, c, v in result.top(5)))
    st.download_button("Patching CSV", exports.csv_text(patching.patch_frame(result)), "patching.csv",
                       "text/csv", key=key("csv"))
