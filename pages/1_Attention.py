"""Attention: paste text, see every layer x head at once, then one chosen view of one head: detail,
lines, finding heads, statistics, head scores, rollout, the model's own output, exports. Layout
and views live in attnviz.ui.attention_page; only the chosen view's work runs."""
import streamlit as st

st.set_page_config(page_title="attnviz · Attention", layout="wide")
st.title("Attention")
with st.spinner("Starting: PyTorch, transformers and attnviz load once per server (a few seconds)…"):
    from attnviz.ui import attention_page  # noqa: E402  (the title is painted first)
attention_page.page()
