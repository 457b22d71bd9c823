"""Latency: what attention costs as sequences grow, measured on this CPU and modelled for a
Raspberry Pi; a CSV from a real Pi overlays measured on modelled. Layout only: the view is
attnviz.ui.latency_page, the work attnviz.latency."""
import streamlit as st

st.set_page_config(page_title="attnviz · Latency", layout="wide")
st.title("Latency")
with st.spinner("Starting: PyTorch, transformers and attnviz load once per server (a few seconds)…"):
    from attnviz.ui import latency_page  # noqa: E402  (the title is painted first)
latency_page.page()
