"""Speech: Whisper's text tokens attending to the audio, and word timestamps from those heads."""
import streamlit as st

st.set_page_config(page_title="attnviz · Speech", layout="wide")
st.title("Speech — where the text listens")
with st.spinner("Starting: PyTorch, transformers and attnviz load once per server (a few seconds)…"):
    from attnviz.ui import speech_page  # noqa: E402  (the title is painted first)
speech_page.page()
