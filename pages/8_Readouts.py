"""Readouts: what the model believes at each layer, which heads wrote the prediction, what it writes next."""
import streamlit as st

st.set_page_config(page_title="Readouts · attnviz", layout="wide")
st.title("Readouts — logit lens, logit attribution, generation, two prompts")
with st.spinner("Starting: PyTorch, transformers and attnviz load once per server (a few seconds)…"):
    from attnviz.ui import readouts_page  # noqa: E402  (the title is painted first)
readouts_page.page()
