"""attnviz home: what it does, the pages, the bundled models, and the shared sidebar model picker."""
import streamlit as st

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
    "5. **Lab** — attention step by step, positional encodings, variants, toy transformers.\n"
    "6. **Translate** — a translation model's cross-attention: which source words each output "
    "word reads.\n"
    "7. **Speech** — Whisper's text tokens attending to the audio, and word timestamps from "
    "those heads.\n"
    "8. **Readouts** — what the model believes at each layer, which heads wrote the prediction."
)

st.subheader("Bundled models")
ui.bundled_models()
model = ui.model_picker()
if model is not None:
    ui.loaded_model(model)
