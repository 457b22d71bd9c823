"""The Latency page's int8 sensitivity: which kind of linear layer torch's dynamic int8 hurts in a
bundled model, found by leaving each kind float32 in turn (`attnviz.latency.quantize.sensitivity`,
also `python -m attnviz.latency.quantize --sensitivity smollm2`). Computed only when asked."""
from __future__ import annotations

import streamlit as st

from attnviz.base.names import session_key
from attnviz.latency import quantize
from attnviz.ui import common
from attnviz.ui import job_controls

PAGE = "latency"
MODELS = ("smollm2", "minilm", "dinov2")


def K(name: str) -> str:
    return session_key(PAGE, f"sensitivity_{name}")


@st.cache_data(max_entries=3, show_spinner="Quantizing the model once per kind of linear layer…")
def sensitivity_table(key: str):
    with job_controls.heavy_job("an int8 sensitivity scan") as cancel:  # a closed tab stops it between copies
        return quantize.sensitivity(common.shared_model(key), check=cancel.check)


def sensitivity_section():
    c1, c2 = st.columns([1, 2])
    key = c1.selectbox("Model", MODELS, key=K("model"))
    if c2.button("Which layers does int8 hurt? (each kind left float32 in turn)", key=K("run")):
        try:
            st.session_state[K("table")] = (key, sensitivity_table(key))
        except ValueError as err:  # the server is busy, or the scan was cancelled
            st.error(common.plain(str(err)))
    shown = st.session_state.get(K("table"))
    if shown is None:
        return
    key, table = shown
    st.dataframe(table, hide_index=True, key=K("view"))
    metric = next(c for c in table.columns if c not in ("float32_kept", "float32_weight_share"))
    best = table.iloc[1:].sort_values(metric, ascending=metric.startswith("KL")).iloc[0] if len(table) > 1 else None
    if best is not None:
        st.caption(f"{key}: with every linear layer int8, {metric} is {table.iloc[0][metric]:.3g}; leaving "
                   f"`{best['float32_kept']}` float32 ({best['float32_weight_share']:.0%} of the linear weights) "
                   f"gives {best[metric]:.3g}, the most any single kind recovers.")
