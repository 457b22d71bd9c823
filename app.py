"""attnviz home: what it does, the pages, the bundled models, and the shared sidebar model picker."""
import pandas as pd
import streamlit as st

import attnviz
from attnviz import ui

st.set_page_config(page_title="attnviz", layout="wide")
st.title("attnviz — every attention head, computed by our own modules")
st.markdown(
    "attnviz runs real pretrained transformers through its **own** attention code (no hooks into "
    "another library) and shows what every head does, for English, Chinese, emoji and long texts. "
    "Pick a model in the sidebar (it stays picked on every page), then open a page:\n\n"
    "1. **Attention** — paste text: every layer × head at a glance, a head in detail, "
    "token-to-token lines, statistics and roles, rollout, the model's own output, exports.\n"
    "2. **Heads** — switch heads off, watch outputs change, rank heads, prune for real.\n"
    "3. **Images** — what each vision head looks at in a photo.\n"
    "4. **Latency** — what attention costs as sequences grow, here and on a Raspberry Pi.\n"
    "5. **Lab** — attention step by step, positional encodings, variants, toy transformers."
)

st.subheader("Bundled models")
st.dataframe(pd.DataFrame([
    dict(model=m.key, family=m.family, task=m.task, layers=m.n_layers, heads=m.n_heads,
         **{"K/V heads": m.n_kv_heads or m.n_heads, "positions": m.max_positions or None,
            "source": m.source, "licence": m.licence})
    for m in attnviz.list_models()]), hide_index=True, key="home_models")
if ui.local_folders_allowed():
    st.caption("A local Hugging Face folder (config.json + model.safetensors) of a BERT, GPT-2, "
               "Llama, ViT or DINOv2 model works too: choose “local folder…” in the sidebar and "
               "type its name. Nothing is downloaded.")
else:
    st.caption("This server offers the models above. Its operator can also let users load local "
               "Hugging Face folders (ATTNVIZ_ALLOWED_MODEL_DIRS, see the README). Nothing is downloaded.")

model = ui.model_picker()
if model is not None:
    c = model.cfg
    st.subheader(f"Loaded: {ui.plain(model.info.key)}")
    cols = st.columns(4)
    cols[0].metric("Layers", c.n_layers)
    cols[1].metric("Heads", c.n_heads)
    cols[2].metric("K/V heads", c.n_kv_heads)
    cols[3].metric("Image size" if c.is_vision else "Positions",
                   f"{model.image_size} px" if c.is_vision else f"{c.max_positions:,}")
    with st.expander("Weights fingerprint"):
        st.caption("SHA-256 of every parameter of the model this server shares between all "
                   "sessions; it never changes while the server runs.")
        st.code(ui.fingerprint(model), language=None)
