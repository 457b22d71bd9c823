"""The only module that imports streamlit: cached loaders, the shared sidebar, session keys."""
from __future__ import annotations

import streamlit as st

import attnviz
from attnviz.loading import BUNDLED, DEFAULT_MODEL

MODEL_KEY = "model_choice"      # session key of the sidebar's model picker
CUSTOM_KEY = "model_custom_dir"  # session key of the local-folder text box


@st.cache_resource(max_entries=4, show_spinner=False)
def load_model(key: str) -> attnviz.Model:
    """One shared, never-mutated model per key for every browser session of this process."""
    return attnviz.load_model(key)


def model_picker(tasks: tuple[str, ...] = ("encoder", "lm", "vision"), default: str | None = None):
    """Sidebar: bundled models of the given tasks plus any local HF folder. Returns Model or None."""
    infos = [m for m in attnviz.list_models() if m.task in tasks]
    keys = [m.key for m in infos] + ["local folder…"]
    default = default or (DEFAULT_MODEL if DEFAULT_MODEL in keys else keys[0])
    page_key = f"{MODEL_KEY}:{'/'.join(tasks)}"
    st.session_state.setdefault(page_key, default)
    if st.session_state[page_key] not in keys:
        st.session_state[page_key] = default
    with st.sidebar:
        choice = st.selectbox("Model", keys, key=page_key,
                              format_func=lambda k: k if k not in BUNDLED else f"{k} ({BUNDLED[k]['family']})")
        if choice == "local folder…":
            choice = st.text_input("Hugging Face model folder", key=CUSTOM_KEY,
                                   placeholder="/path/to/model (config.json + model.safetensors)").strip()
            if not choice:
                st.info("Type the path of a local model folder.")
                return None
        try:
            with st.spinner(f"Loading {choice} (the first start converts and caches the weights)…"):
                model = load_model(choice)
        except ValueError as err:
            st.error(str(err))
            return None
        if model.cfg.task not in tasks:
            st.error(f"{choice} is a {model.cfg.task} model; this page needs one of: {', '.join(tasks)}.")
            return None
        show_shape(model)
    return model


def show_shape(model: attnviz.Model):
    c = model.cfg
    st.caption(f"**{model.info.key}** · {c.family} · {c.n_layers} layers × {c.n_heads} heads"
               f" ({c.n_kv_heads} K/V) · d_model {c.d_model} · "
               f"{'image ' + str(model.image_size) + ' px' if c.is_vision else str(c.max_positions) + ' positions'}"
               f" · {model.num_params() / 1e6:.1f} M params")
