"""Readouts: what the model believes at each layer, which heads wrote the prediction, what it writes next."""
import streamlit as st

from attnviz.ui import readouts

st.set_page_config(page_title="Readouts · attnviz", layout="wide")
st.title("Readouts — logit lens, logit attribution, generation, two prompts")
readouts.page()
