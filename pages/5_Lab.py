"""Lab: attention step by step on a real head, positional encodings, variants inside a pretrained
model, and toy transformers trained here in under a minute. Views live in attnviz.ui.lab; only the
chosen one runs, and its heavy work waits for a button."""
import streamlit as st

from attnviz.ui import lab

st.set_page_config(page_title="attnviz · Lab", layout="wide")
st.title("Lab")
lab.page()
