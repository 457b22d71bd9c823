"""The Latency page's section pricing two real decoders on a Pi side by side (`latency.model_pair`):
Gemma 3 270M's 4 query heads sharing 1 K/V head beside SmolLM2's 9 and 3. Computed when asked."""
from __future__ import annotations

import streamlit as st

from attnviz.latency import model_pair
from attnviz.ui import common

KEY = "latency.model_pair"


def pair_section():
    a, b = model_pair.PAIR
    st.subheader(f"Two real decoders on a Pi: {a} beside {b}")
    st.caption(f"Fewer, wider heads in two models that exist: {a} has 4 query heads sharing one K/V head "
               f"(256 wide) and keeps 15 of its 18 layers to the last 512 keys; {b} has 9 query heads, 3 K/V "
               "heads (64 wide), every layer global. Priced by the cost model at the Pi's 4 threads.")
    if st.button(f"Price {a} and {b} on a Pi 4 and Pi 5 (loads both models)", key=f"{KEY}.go"):
        try:
            with st.spinner(f"Loading {a} and {b} (a first load of {a} converts its file: about 90 s)…"):
                configs = {k: common.shared_model(k).cfg for k in model_pair.PAIR}
        except ValueError as err:
            st.error(common.plain(str(err)))
            return
        st.session_state[KEY] = (model_pair.shapes(configs), model_pair.pi_prices(configs))
    if KEY not in st.session_state:
        return
    shapes, prices = st.session_state[KEY]
    st.dataframe(shapes, hide_index=True, key=f"{KEY}.shapes")
    for device in ("pi4", "pi5"):
        st.markdown(common.plain(model_pair.verdict(prices, a, b, device=device, n=512)))
    st.dataframe(prices, hide_index=True, key=f"{KEY}.prices",
                 column_config={"prompt ms": st.column_config.NumberColumn(format="%.0f"),
                                "next token ms": st.column_config.NumberColumn(format="%.1f"),
                                "attention share": st.column_config.NumberColumn(format="percent"),
                                "output layer share": st.column_config.NumberColumn(format="percent")})
    st.caption("Modelled, ±25 % (the cost model's band on a Pi). Prompt: one pass over n tokens, the output "
               "layer on the last token only (as llama.cpp runs it); next token: one step with n tokens "
               f"cached. {a}'s next token is dominated by its output layer over 262,144 vocabulary entries.")
