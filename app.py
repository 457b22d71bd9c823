"""attnviz home: what it does, the pages, the bundled models, and the shared sidebar model picker."""
import streamlit as st

st.set_page_config(page_title="attnviz", layout="wide")
st.title("attnviz — every attention head, computed by our own modules")
with st.spinner("Starting: PyTorch, transformers and attnviz load once per server (a few seconds)…"):
    from attnviz.ui import home_page  # noqa: E402  (the title is painted first)
home_page.page()
