"""attnviz home: what it does, the pages, and the model picker every page shares."""
import streamlit as st

from attnviz import ui

st.set_page_config(page_title="attnviz", layout="wide")
st.title("attnviz — every attention head, computed by our own modules")
st.markdown(
    "attnviz runs real pretrained transformers through its **own** attention code and shows what "
    "every head does. Pick a model in the sidebar, then open a page:\n\n"
    "1. **Attention** — paste text: every layer × head at a glance, a head in detail, statistics, rollout.\n"
    "2. **Heads** — switch heads off, watch outputs change, rank heads, prune for real.\n"
    "3. **Images** — what each vision head looks at in a photo.\n"
    "4. **Latency** — what attention costs as sequences grow, here and on a Raspberry Pi.\n"
    "5. **Lab** — attention step by step, positional encodings, variants, toy transformers."
)
model = ui.model_picker()
if model is not None:
    st.subheader("Try it")
    tr = None
    if not model.cfg.is_vision:
        text = st.text_input("A sentence", "The cat sits on the mat.", key="home_text")
        try:
            tr = model.trace(text)
        except ValueError as err:
            st.warning(str(err))
    if tr is not None:
        st.write(f"{tr.n} tokens: " + " · ".join(tr.tokens))
        st.write(f"Attention captured: {list(tr.attentions.shape)} (layers × heads × queries × keys)")
