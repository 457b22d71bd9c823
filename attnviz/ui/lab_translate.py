"""The Lab's toy translator: an encoder-decoder trained on an SVO -> SOV language pair where the
right alignment of every target word is known, and how often each layer's cross-attention peak
falls on it (`attnviz.toys.toy_translator`)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from attnviz.base import names
from attnviz.figures import translation_figures
from attnviz.toys import toy_translator
from attnviz.ui.common import plain
from attnviz.ui import shared_view

PAGE = "lab"


def key(name: str) -> str:
    return names.session_key(PAGE, f"toy_translate_{name}")


@st.cache_resource(max_entries=1, show_spinner=False)
def shipped():
    return toy_translator.load()


def toy_translator_view(_model=None):
    """The view (the Lab passes its picked model; this view has its own)."""
    model, meta = shipped()
    c = model.cfg
    st.markdown(
        "A small encoder-decoder (Marian layout: "
        f"{c.n_enc_layers}+{c.n_dec_layers} layers × {c.n_heads} heads, d {c.d_model}) learned to turn an "
        "SVO language into an SOV language with particles: *cat sees red fish* → *cat ga red fish wo sees*. "
        "Every target word except the particles copies one source word, so the right alignment is known "
        "exactly; the verb moves to the end, so its line crosses the others. Its decoder also has "
        "self-attention, so it *could* route a word through earlier target positions instead of looking "
        "at the source: the hit rates below show how much each layer's cross-attention actually points "
        "at the aligned word.")
    a = meta["alignment"]
    c1, c2, c3 = st.columns(3)
    c1.metric("held-out sentences translated exactly", f"{a['exact']:.0%}")
    c2.metric("held-out sentences", f"{a['n_sentences']:,}")
    c3.metric("training", f"{meta['steps']} steps, {meta['train_seconds']:g} s")
    st.markdown("**Cross-attention peak on the aligned source word** (subject, adjective, object, verb):")
    st.dataframe(pd.DataFrame({"layer": list(range(c.n_dec_layers)),
                               "head average": [f"{x:.0%}" for x in a["layers"]],
                               **{f"H{h}": [f"{row[h]:.0%}" for row in a["heads"]] for h in range(c.n_heads)}}),
                 hide_index=True, key=key("table"))
    st.caption("Trained by `python -m attnviz.toys.toy_translator` (about a minute on one core); "
               f"{toy_translator.HELD_OUT:.0%} of the {len(toy_translator.sentences()):,} possible sentences were never trained on.")
    cols = st.columns(4)
    words = [cols[0].selectbox("Subject", **shared_view.linked(key("s"), options=toy_translator.SUBJECTS)),
             cols[1].selectbox("Verb", index=2, **shared_view.linked(key("v"), options=toy_translator.VERBS)),
             cols[2].selectbox("Adjective", **shared_view.linked(key("a"), options=toy_translator.ADJECTIVES)),
             cols[3].selectbox("Object", index=1, **shared_view.linked(key("o"), options=toy_translator.OBJECTS))]
    source = " ".join(words)
    try:
        tr = model.translate(source)
    except ValueError as err:
        st.error(plain(str(err)))
        return
    want = f"{words[0]} ga {words[2]} {words[3]} wo {words[1]}"
    st.markdown(f"**{plain(tr.text)}**" + ("" if tr.text == want else f" (expected {plain(want)})"))
    layer = st.selectbox("Layer", list(range(c.n_dec_layers)), index=c.n_dec_layers - 1, key=key("layer"))
    # one node per token, a line per weight: the toy's words are whole tokens with no word-start
    # marks, so grouping pieces into words (as Translate does) joined each sentence into one node
    st.plotly_chart(translation_figures.alignment_figure(tr.cross_attentions[layer].mean(0), tr.source_tokens,
                                                         tr.target_tokens, title=f"Layer {layer}, average of heads"),
                    key=key("lines"))
