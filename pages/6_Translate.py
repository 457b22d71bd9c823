"""Translate: a sentence through a real encoder-decoder, and where its decoder looks."""
import streamlit as st

st.set_page_config(page_title="attnviz · Translate", layout="wide")
st.title("Translate — where the decoder looks")
with st.spinner("Starting: PyTorch, transformers and attnviz load once per server (a few seconds)…"):
    from attnviz.ui import translate as view  # noqa: E402  (the title is painted first)

picked = view.inputs()
if picked is None:
    st.stop()
model, text, beam = picked
view.explain(model)
tr = view.translation(model, text, beam)
if tr is None:
    st.stop()
view.summary(model, tr)

view.views(model, text, beam, tr)
