"""Attention: paste text, see every layer x head at once, then one chosen view of one head: detail,
lines, finding heads, statistics, head scores, rollout, the model's own output, exports. Layout
and views live in attnviz.ui.attention; only the chosen view's work runs."""
import streamlit as st

from attnviz.ui import attention

st.set_page_config(page_title="attnviz · Attention", layout="wide")
st.title("Attention")
attention.page()
