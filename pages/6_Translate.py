"""Translate: a sentence through a real encoder-decoder, and where its decoder looks."""
import streamlit as st

st.set_page_config(page_title="attnviz · Translate", layout="wide")
st.title("Translate — where the decoder looks")
with st.spinner("Starting: PyTorch, transformers and attnviz load once per server (a few seconds)…"):
    from attnviz.ui import translate_page  # noqa: E402  (the title is painted first)
translate_page.page()
