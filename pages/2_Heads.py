"""Heads: switch heads off and watch the outputs change; rank heads; pruning curves; real pruning."""
import streamlit as st

st.set_page_config(page_title="Heads · attnviz", layout="wide")
st.title("Heads — switch heads off, rank them, prune for real")
with st.spinner("Starting: PyTorch, transformers and attnviz load once per server (a few seconds)…"):
    from attnviz.ui import heads_page  # noqa: E402  (the title is painted first)
heads_page.page()
