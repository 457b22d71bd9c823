"""attnviz home: what it does, the pages, the bundled models, and the shared sidebar model picker."""
import streamlit as st

st.set_page_config(page_title="attnviz", layout="wide")
st.title("attnviz — every attention head, computed by our own modules")
with st.spinner("Starting: PyTorch, transformers and attnviz load once per server (a few seconds)…"):
    from attnviz import ui  # noqa: E402  (the title is painted first)
st.markdown(
    "attnviz runs real pretrained transformers through its **own** attention code (no hooks into "
    "another library) and shows what every head does, for English, Chinese, emoji and long texts. "
    "Pick a model in the sidebar (it stays picked on every page), then open a page:"
)
ui.page_list()

st.subheader("Bundled models")
ui.bundled_models()
model = ui.model_picker()
if model is not None:
    ui.loaded_model(model)
