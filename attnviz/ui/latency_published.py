"""The Latency page's calibration section: every published Raspberry Pi run the engines are fitted to
or checked against, with the cost model's prediction beside it (`attnviz.latency.published`, also
`python -m attnviz.bench --published`), so a reader can see how far to trust a modelled Pi row."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from attnviz.base import exports
from attnviz.base.names import session_key
from attnviz.figures.calibration_figures import calibration_figure
from attnviz.latency import engines, published

PAGE = "latency"
UNITS = {"ms": "ms a pass", "pp_tps": "prompt tokens/s", "tg_tps": "generated tokens/s",
         "ms_per_gflop": "ms per GFLOP (marginal)"}


def K(name: str) -> str:
    return session_key(PAGE, f"published_{name}")


@st.cache_data(max_entries=1, show_spinner=False)
def runs_table() -> pd.DataFrame:
    df = pd.DataFrame(published.table())
    df["unit"] = df["metric"].map(UNITS)
    return df[["device", "engine", "dtype", "role", "unit", "n", "threads", "published", "predicted", "error_pct",
               "source", "shape", "metric"]]


@st.cache_data(max_entries=1, show_spinner=False)
def releases_table() -> pd.DataFrame:
    """One row per device x engine: its dtypes and the release(s) their profiles model."""
    df = pd.DataFrame(engines.releases())
    df["dtype"] = df["dtype"] + df["derived"].map({True: " (derived)", False: ""})
    return (df.groupby(["device", "engine", "release", "years"], sort=False)["dtype"].agg(", ".join)
            .reset_index()[["device", "engine", "dtype", "release", "years"]])


def published_section():
    st.subheader("How the Pi rows are calibrated")
    st.caption("Which engine release each Pi profile models (the code its published runs ran): " + "; ".join(
        f"{r.device} {r.engine} {r.dtype}: {r.release}" for r in releases_table().itertuples()) + ". Engines get "
        "faster between releases, so a newer whisper.cpp or llama.cpp may beat its profile; `--engine ggml@YEAR` "
        "refuses a year no published run covers.")
    if not st.toggle("Show every published Raspberry Pi run the engines are fitted to, with the model's prediction",
                     key=K("show")):
        return
    df = runs_table()
    st.plotly_chart(calibration_figure(df), key=K("figure"))
    st.dataframe(df, hide_index=True, key=K("table"), column_config={
        "error_pct": st.column_config.NumberColumn("error %", format="%+.1f"),
        "published": st.column_config.NumberColumn(format="%.4g"),
        "predicted": st.column_config.NumberColumn(format="%.4g")})
    worst = df.loc[df["error_pct"].abs().idxmax()]
    st.caption(f"{len(df)} published runs, every one within ±25% (the largest miss: {worst['error_pct']:+.1f}% on "
               f"{worst['device']} {worst['engine']} {worst['dtype']}). 'fit' runs set a factor, 'check' runs are "
               "predicted by factors fitted to others. Not calibrated by any published run, and said so in each "
               "row's source: torch int8 on a Pi (derived from fp32 with ncnn's int8 / fp32 ratio), ncnn int8, "
               "ncnn fp32 on a Pi 5 and q4_0 on a Pi 4. bf16 is not modelled on a Pi: its cores have no bf16 "
               "arithmetic.")
    st.download_button("Published runs CSV", exports.csv_text(df), "attnviz_published_pi_runs.csv", "text/csv",
                       key=K("download"), on_click="ignore")
