"""The Latency page's one-block crossover: where attention takes as long as the rest of a block,
measured here and modelled (the sweep's rows with test "block", `attnviz.latency.crossover`)."""
from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from attnviz.base.names import session_key
from attnviz.figures.crossover_figures import crossover_figure
from attnviz.latency import crossover
from attnviz.latency import results
from attnviz.ui import common


def crossover_view(df: pd.DataFrame | None):
    """One figure per model (and variant, threads) whose block rows the results hold, then the table."""
    if df is None or "test" not in df.columns or not (df["test"] == "block").any():
        return
    blocks = df[df["test"] == "block"]
    table = crossover.crossover_table(blocks)
    for i, r in enumerate(table.itertuples()):
        rows = blocks[(blocks["model"] == r.model) & (blocks["variant"] == r.variant) & (blocks["threads"] == r.threads)]
        cfg = results.row_config(rows.iloc[0])
        positions = cfg.max_positions if cfg.positional == "learned" and not cfg.is_vision else None
        st.plotly_chart(crossover_figure(rows, r.measured_n, r.modelled_n, str(r.model), positions),
                        key=session_key("latency", f"fig_crossover_{i}"))
        if r.measured_n and r.modelled_n and not math.isnan(r.error_pct):
            st.caption(f"{common.plain(str(r.model))} · {common.plain(str(r.variant))} · {r.threads} thread(s): "
                       f"attention = rest at n ≈ {r.measured_n:,.0f} measured, {r.modelled_n:,.0f} modelled "
                       f"({r.error_pct:+.0f}%). One block is timed because every block has the same shape: the "
                       "crossover is per block, and one block reaches it in a fraction of a pass.")
        else:
            st.caption(f"{common.plain(str(r.model))}: the measured lengths do not straddle the crossover "
                       "(the time budget stopped the longest, or this variant's attention never catches up).")
    st.dataframe(table, hide_index=True, key=session_key("latency", "crossover_table"))
    st.caption("On a busy machine choose the cpu clock with one thread: wall time with several threads includes "
               "other programs (here, MiniLM's block at 2 threads ran its linear layers 3x slower than calibrated).")
