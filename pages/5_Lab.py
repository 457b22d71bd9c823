"""Lab: attention step by step on a real head, positional encodings, variants inside a pretrained
model, and toy transformers trained here in under a minute. Views live in attnviz.ui.lab_page; only the
chosen one runs, and its heavy work waits for a button."""
import streamlit as st

st.set_page_config(page_title="attnviz · Lab", layout="wide")
st.title("Lab")
with st.spinner("Starting: PyTorch, transformers and attnviz load once per server (a few seconds)…"):
    from attnviz.ui import lab_page  # noqa: E402  (the title is painted first)
lab_page.page()
