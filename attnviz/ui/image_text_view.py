"""The Images page's views for models that read text as well as the photo: a two-tower model
(CLIP, SigLIP) scores captions typed by the user against the photo and shows which patches and
which words each tower's pooled token reads; a text encoder over the image (BLIP's matching) shows
each word's cross-attention over the patches, per head, with cross-attention heads switchable.

`views(model)` gives the page {label: view function(view, trace, off, head_mask)} for the model
(none for a vision-only model); the page draws them beside its own.
"""
from __future__ import annotations

import streamlit as st
import torch

from attnviz.analysis import image_text
from attnviz.base.names import session_key
from attnviz.core.dual import DualModel
from attnviz.core.matcher import Matcher
from attnviz.figures import image_figures, image_text_figures, render
from attnviz.figures.attention_figures import head_heatmap
from attnviz.ui import common, shared_view

PAGE = "images"
CAPTIONS_VIEW = "Image ↔ captions"
WORDS_VIEW = "Words → patches"
DEFAULT_CAPTIONS = "a photo of a cat\na photo of a dog\na photo of a rocket"


def K(name: str) -> str:
    return session_key(PAGE, name)


def views(model) -> dict:
    """The extra views this model has on the Images page."""
    if isinstance(model, DualModel):
        return {CAPTIONS_VIEW: captions_view}
    return {WORDS_VIEW: words_view} if isinstance(model, Matcher) else {}


@st.cache_resource(max_entries=4, show_spinner=False)
def matched(model_key: str, trace_key: str, captions: tuple[str, ...], _model, _trace):
    """The captions scored against the photo's trace (one text-tower pass per caption)."""
    return _model.match(None, list(captions), trace=_trace)


def captions_view(view, tr, off, head_mask):
    model = view.model
    st.session_state.setdefault(K("captions"), DEFAULT_CAPTIONS)
    text = st.text_area("Captions, one per line", **shared_view.linked(K("captions"), chars=2000),
                        help=f"up to {image_text.MAX_CAPTIONS}; each is read by the text tower on its own")
    try:
        captions = image_text.captions_from(text)
        mask_key = "all" if head_mask is None else head_mask.numpy().tobytes().hex()
        match = matched(model.info.key, f"{view.image_key}:{view.fit}:{view.size}:{mask_key}", tuple(captions),
                        model, tr)
    except ValueError as err:
        st.error(common.plain(str(err)))
        return
    table = image_text.caption_table(match)
    best = table.iloc[0]
    how = "softmax over the captions: they compete" if match.score == "softmax" else \
        "a sigmoid per caption: each is a yes or no on its own"
    st.markdown(f"Best match: **{common.plain(best['caption'])}** ({how}).")
    st.plotly_chart(image_text_figures.caption_scores_figure(table), key=K("caption_scores"))
    left, right = st.columns(2)
    with left:
        image_side(view, match, off)
    with right:
        text_side(model, match)


def image_side(view, match, off):
    maps = image_text.image_read_maps(match)                               # (L', H, gh, gw)
    if match.probe:
        st.markdown("**Image tower**: its pooled token is the attention-pooling head's probe, one query "
                    "reading every patch after the last layer.")
        layer, label, heads_off = 0, "pooling probe", None
    else:
        st.markdown("**Image tower**: its pooled token is CLS; what it reads in each layer.")
        last = maps.shape[0] - 1
        layer = st.slider("Image layer", **shared_view.linked(K("pool_layer"), bounds=(0, last)),
                          value=st.session_state.get(K("pool_layer"), last))
        label, heads_off = f"CLS, layer {layer}", off[layer:layer + 1]
    st.image(render.overlay_patch_map(view.shown, maps[layer].mean(0), view.alpha),
             caption=f"{label}: mean over heads, scaled to its own range")
    st.image(image_figures.head_overlays(view.shown, maps[layer:layer + 1], [layer], tile=112, alpha=view.alpha,
                                         off=heads_off),
             caption=f"{label}, per head (each tile its own range)")


def text_side(model, match):
    st.markdown("**Text tower**: each caption's pooled token (◀) and what it reads, layer by layer.")
    n = len(match.captions)
    i = st.selectbox("Caption", **shared_view.linked(K("caption_i"), options=list(range(n))),
                     format_func=lambda j: match.captions[j]) if n > 1 else 0
    i = min(int(i or 0), n - 1)
    tokens, reads = image_text.text_reads(match, i)
    st.plotly_chart(image_text_figures.pooled_reads_figure(tokens, reads, match.pooled[i],
                                                           "pooled token → words, mean over heads"),
                    key=K("pooled_reads"))
    tr = match.texts[i]
    cols = st.columns(2)
    L, H = tr.attentions.shape[:2]
    layer = cols[0].slider("Text layer", **shared_view.linked(K("text_layer"), bounds=(0, L - 1)))
    head = cols[1].slider("Text head", **shared_view.linked(K("text_head"), bounds=(0, H - 1)))
    causal = model.joint.text.causal
    st.plotly_chart(head_heatmap(tr.attentions[layer, head], tokens, causal=causal,
                                 title=f"text layer {layer}, head {head}" + (" (causal)" if causal else "")),
                    key=K("text_heatmap"))


@st.cache_resource(max_entries=4, show_spinner=False)
def read(model_key: str, trace_key: str, text: str, cross_key: bytes, _model, _trace, _cross_mask):
    """The text read against the photo's trace, its switched-off cross-attention heads applied."""
    return _model.read(None, text, cross_mask=_cross_mask, trace=_trace)


def words_view(view, tr, off, head_mask):
    model = view.model
    cfg = model.text_cfg
    st.session_state.setdefault(K("blip_text"), "a photo of a cat")
    text = st.text_input("Text read against the photo", **shared_view.linked(K("blip_text"), chars=300))
    heads = [f"L{layer}.H{head}" for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]
    off_names = st.multiselect("Cross-attention heads switched off", **shared_view.linked(
        K("cross_off"), options=heads, kind=list), help="the text encoder's heads that read the image")
    try:
        cross = image_text.cross_mask(off_names, cfg.n_layers, cfg.n_heads)
        mask_key = "all" if head_mask is None else head_mask.numpy().tobytes().hex()
        trace_key = f"{view.image_key}:{view.fit}:{view.size}:{mask_key}"
        reading = read(model.info.key, trace_key, text, cross.numpy().tobytes(), model, tr,
                       cross if (cross == 0).any() else None)
        every = torch.ones_like(cross)
        full = read(model.info.key, trace_key, text, every.numpy().tobytes(), model, tr, None)
    except ValueError as err:
        st.error(common.plain(str(err)))
        return
    n_off = int((cross == 0).sum())
    st.metric("P(text matches photo)", f"{reading.match:.4f}",
              delta=f"{reading.match - full.match:+.4f} with {n_off} cross-attention heads off" if n_off else None,
              help="the matching head's softmax on the first token, after the text has read the photo")
    cols = st.columns(2)
    n = len(reading.tokens)
    word = cols[0].selectbox("Word (query)", **shared_view.linked(K("word"), options=list(range(n))),
                             format_func=lambda i: f"{i}: {reading.tokens[i]}")
    word = min(int(word or 0), n - 1)
    layer = cols[1].slider("Text layer", **shared_view.linked(K("cross_layer"), bounds=(0, cfg.n_layers - 1)))
    maps = reading.patch_attentions[layer]                                   # (H, n, gh, gw)
    heads_off = (cross == 0)[layer:layer + 1]
    st.image(image_figures.head_overlays(view.shown, maps[:, word][None], [layer], tile=160, alpha=view.alpha,
                                         off=heads_off),
             caption=f"“{common.plain(reading.tokens[word])}” as the query, the photo as keys and values: "
                     f"its cross-attention per head of text layer {layer} (each tile its own range)")
    st.image([render.overlay_patch_map(view.shown, maps[:, i].mean(0), view.alpha) for i in range(n)],
             caption=[common.plain(t) for t in reading.tokens], width=120)
    st.caption("Each word's cross-attention over the patches in this layer, mean over heads (each its own range).")
