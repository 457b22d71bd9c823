"""Translate: a sentence through a real encoder-decoder, and where its decoder looks."""
import streamlit as st

from attnviz.ui import translate as view

st.set_page_config(page_title="attnviz · Translate", layout="wide")
st.title("Translate — where the decoder looks")

picked = view.inputs()
if picked is None:
    st.stop()
model, text, beam = picked
view.explain(model)
tr = view.translation(model, text, beam)
if tr is None:
    st.stop()
view.summary(model, tr)

cross, lines, steps, enc, off = st.tabs(["Cross-attention", "Alignment", "Step through decoding",
                                         "Encoder self-attention", "Switch heads off"])
with cross:
    view.cross_attention(model, tr)
with lines:
    view.alignment_lines(model, tr)
with steps:
    view.steps(model, tr)
with enc:
    view.encoder(model, tr)
with off:
    view.heads_off(model, text, beam, tr)
