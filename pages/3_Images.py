"""Images: what each head of a vision transformer looks at in a photo."""
import streamlit as st

st.set_page_config(page_title="attnviz · Images", layout="wide")
st.title("Images — what each head looks at")
with st.spinner("Starting: PyTorch, transformers and attnviz load once per server (a few seconds)…"):
    from attnviz.ui import images_page  # noqa: E402  (the title is painted first)
images_page.page()
