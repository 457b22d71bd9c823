"""Latency: what attention costs as sequences grow, measured on this CPU and modelled for a
Raspberry Pi; a CSV from a real Pi overlays measured on modelled. Layout only: the view is
attnviz.ui.latency, the work attnviz.latency."""
import streamlit as st

st.set_page_config(page_title="attnviz · Latency", layout="wide")
st.title("Latency")
with st.spinner("Starting: PyTorch, transformers and attnviz load once per server (a few seconds)…"):
    from attnviz.ui import latency as view  # noqa: E402  (the title is painted first)
    from attnviz.ui import latency_published, latency_sensitivity, latency_speech, latency_translate  # noqa: E402
view.intro()
view.sweep_form()
view.results_views()
view.edge_views()
latency_sensitivity.sensitivity_section()
latency_published.published_section()
latency_translate.translation_section()
latency_speech.speech_section()
view.device_import()
