"""The Translate page's views: a sentence through a real encoder-decoder, its cross-attention per
layer and head, alignment lines, decoding step by step, the encoder's self-attention, and
cross-attention heads switched off. Only the chosen view is drawn and computed (`views`, through
the project's remembered `view_choice`). The page itself is a title plus calls to these functions."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st
import torch

from attnviz.analysis import alignment, head_ablation
from attnviz.base import memory, names
from attnviz.base.limits import LIMITS
from attnviz.core import tokens
from attnviz.figures import attention_figures
from attnviz.figures import translation_figures
from attnviz.ui import hub_picker, kept_inputs, patching_view, prompt_translate_view, shared_view
from attnviz.ui.common import LOCAL, load_folder, local_folders_allowed, plain, shared_model, sidebar_nav, view_choice
from attnviz.ui.head_editor import ablation_choice, head_editor, mask_key
from attnviz.ui.heads_corpus import page_tool
from attnviz.weights.catalogue import list_models

PAGE = "translate"
DEFAULT_TEXT = "I love you."
AVERAGE = "average of heads"
KINDS = "Marian (opus-mt), BART, mBART, M2M100 / NLLB or T5"   # the encoder-decoders a folder or name may hold


def key(name: str) -> str:
    return names.session_key(PAGE, name)


def directions() -> list[str]:
    return [m.key for m in list_models() if m.task == "translation"]


# ---------------------------------------------------------------- inputs
def inputs():
    """Sidebar and text box -> (model, text, beam), or None after showing why."""
    bundled = directions()
    named = [n for n in hub_picker.entries(("translation",)) if n != hub_picker.ENTRY]   # the HF cache's
    keys = bundled + named + ([LOCAL] if local_folders_allowed() else [])
    sidebar_nav()
    with st.sidebar:
        direction = st.radio("Direction", horizontal=True, **shared_view.linked(
            key("direction"), format_func=lambda k: k.replace("-", " → ") if k in bundled else k, options=keys))
        typed = st.text_input(f"{KINDS} folder", key=key("folder"),
                              help="A Hugging Face folder inside this server's allowed model folders") \
            if direction == LOCAL else ""
        beam = st.select_slider("Beam size", value=1, **shared_view.linked(key("beam"), options=[1, 2, 3, 4, 5]),
                                help="1 is greedy decoding. Beams are ranked by log-probability per "
                                     "token (Marian's length normalisation).")
        st.caption(f"Limits: {LIMITS.max_source_tokens} source tokens (longer text is cut), at most "
                   f"2.5 × source + 5 target tokens (≤ {LIMITS.max_target_tokens}), "
                   f"{LIMITS.max_translate_seconds:g} s per translation. A beam search over more than "
                   f"{LIMITS.heavy_beam_tokens} source tokens takes one of the server's heavy-job slots.")
    if key("text") not in st.query_params:   # a reload keeps the sentence in the link
        st.session_state.setdefault(key("text"), DEFAULT_TEXT)
    # a form: Translate (or Ctrl+Enter) runs it, typing does not
    with st.form(key("form"), border=False):
        text = st.text_area("Sentence", key=key("text"), height=90, help=kept_inputs.LINK_HELP,
                            **kept_inputs.kept())
        st.form_submit_button("Translate", key=key("go"), type="primary")
    if not text.strip():
        st.error("The text is empty: type or paste a sentence to translate.")
        return None
    if direction == LOCAL and not typed.strip():
        st.info(f"Type the folder of a {KINDS} checkpoint.")
        return None
    try:
        with st.spinner(f"Loading {typed or direction}…"):
            model = load_folder(typed) if direction == LOCAL else shared_model(direction)
    except ValueError as err:
        st.error(plain(str(err)))
        return None
    if model.kind != "translator":
        st.error(f"{plain(typed or direction)} holds a {plain(model.info.family)} model, not a translator: "
                 f"give a {KINDS} folder.")
        return None
    if model.pieces is None:
        st.error(f"{plain(typed or direction)} has no tokenizer: this page needs one to read text.")
        return None
    return target_language(model), text, beam


def target_language(model):
    """A multilingual model (its tokenizer names language tokens) translating into the language
    picked in the sidebar: its token forced first, as the model was trained. Others as they are."""
    languages = model.languages
    if not languages:
        return model
    default = model.target_language or next((t for t in languages if t.lower().strip("_")[:2] in ("pt", "po")),
                                            languages[0])
    if st.session_state.get(key("into")) not in languages:   # another model's language
        st.session_state.pop(key("into"), None)
    with st.sidebar:
        picked = st.selectbox("Into", languages, index=languages.index(default), key=key("into"),
                              help="The target language: its token is forced as the first target token.")
    return model.into(picked)


@st.cache_resource(max_entries=16, show_spinner=False)
def _translated(model_key: str, text: str, beam: int, mask_key: bytes, _model, _mask, _fill=None):
    # cache_resource: one result per input, mask and fill (mask_key holds both), shared, never changed by a view
    n_src, c = len(_model.source(text)[0]), _model.cfg  # priced before it runs: every layer at the longer side
    memory.plan_capture("this translation", layers=c.n_enc_layers + 2 * c.n_dec_layers, heads=c.n_heads,
                        n=max(n_src, _model.target_limit(n_src)), shorten="the text")
    return _model.translate(text, beam=beam, head_mask=_mask, head_fill=_fill)


@st.cache_resource(max_entries=16, show_spinner=False)
def _traced(model_key: str, text: str, target: tuple, mask_key: bytes, _model, _mask, _fill=None):
    return _model.trace(text, target=list(target), head_mask=_mask, head_fill=_fill)


@st.cache_resource(max_entries=8, show_spinner=False)
def _means(model_key: str, text: str, beam: int, _model, _tr):
    # the heads' mean outputs over this sentence and its translation (mean ablation's fill)
    return _model.head_means(_tr.source_ids, _tr.target_ids)["cross"]


def translation(model, text: str, beam: int, mask=None):
    """The (cached) translation, or None after showing the error."""
    try:
        with st.spinner("Translating…"):
            return _translated(model.info.key, text, beam, mask_key(mask), model, mask)
    except ValueError as err:
        st.error(plain(str(err)))
        return None


# ---------------------------------------------------------------- explanation and summary
def explain(model):
    c = model.cfg
    with st.expander("Where Q, K and V come from", expanded=False):
        st.markdown(
            f"The **encoder** ({c.n_enc_layers} layers) reads the whole source sentence once; each of its "
            f"layers is self-attention (queries, keys and values all from the source) and a feed-forward "
            f"network. The **decoder** ({c.n_dec_layers} layers) writes the translation one piece at a time. "
            "In its **cross-attention** the **query** comes from the decoder's current position (what it "
            "is about to write) and the **keys and values** come from the encoder's output (the source "
            "words): row *t* of a cross-attention map says where the decoder looked while choosing "
            "target piece *t*.\n\n"
            + ("This decoder has **no self-attention**: each layer starts with an **SSRU**, a tiny "
               "recurrent cell (c = f·c_prev + (1−f)·xW, then ReLU) that carries what was written so far. "
               "Only cross-attention looks anywhere, so every attention map here is decoder → source."
               if c.decoder == "ssru" else
               "Each decoder layer also has causal self-attention over the pieces written so far."))
    if model.target_language:
        st.caption(f"Translating into {plain(model.target_language)}: its token is forced as the first target "
                   "piece, as this multilingual model was trained; the source starts with its own language's "
                   "token where its tokenizer writes one.")


def summary(model, tr):
    st.subheader(tr.text or "(empty translation)")
    c1, c2, c3 = st.columns(3)
    c1.metric("log-probability", f"{tr.logprob:.3f}")
    c2.metric("per token", f"{tr.logprob / max(1, tr.n_tgt):.3f}")
    c3.metric("tokens", f"{tr.n_src} → {tr.n_tgt}")
    if tr.truncated:
        st.warning(f"The text was cut: {tr.truncated:,} source tokens past the limit of "
                   f"{LIMITS.max_source_tokens} were dropped (ATTNVIZ_MAX_SOURCE_TOKENS).")
    if tr.stopped == "max_tokens":
        st.warning(f"Decoding stopped at the target-token limit ({tr.max_tokens} tokens) before the "
                   "end of sentence.")
    elif tr.stopped == "deadline":
        st.warning(f"Decoding stopped at the time limit ({LIMITS.max_translate_seconds:g} s); "
                   "the translation is what was written until then.")
    if tr.unknown:
        st.info("Pieces outside the vocabulary (the model sees them as ⟨unk⟩): "
                + ", ".join(plain(t.replace("⟨unk⟩", "")) for t in tr.unknown))
    if tr.text.strip() == " ".join(tr.source_tokens).strip() or _same_words(tr):
        st.info("The translation repeats the source: it may already be in the target language.")


def _same_words(tr) -> bool:
    src = [w.lower() for w in alignment.word_groups(tr.source_tokens)[0] if w != "</s>"]
    tgt = [w.lower() for w in alignment.word_groups(tr.target_tokens)[0] if w != "</s>"]
    return len(src) > 1 and src == tgt


# ---------------------------------------------------------------- views
def _layer_head(tr, name: str, n_layers: int, n_heads: int, default_layer: int):
    c1, c2 = st.columns(2)
    layer = c1.selectbox("Layer", index=default_layer, **shared_view.linked(key(f"{name}_layer"), options=range(n_layers)))
    head = c2.selectbox("Head", **shared_view.linked(key(f"{name}_head"), options=[AVERAGE] + list(range(n_heads))))
    return layer, head


def cross_attention(model, tr):
    c = model.cfg
    st.caption("Rows: target pieces as they were written; columns: source pieces. Each row sums to 1.")
    layer, head = _layer_head(tr, "cross", c.n_dec_layers, c.n_heads, c.n_dec_layers - 1)
    att = tr.cross_attentions[layer]
    matrix = att.mean(0) if head == AVERAGE else att[head]
    title = f"Layer {layer}, " + ("average of heads" if head == AVERAGE else names.head_name(layer, head))
    st.plotly_chart(attention_figures.head_heatmap(matrix, tr.target_tokens, tr.source_tokens, title=title, zmax=1),
                    key=key("cross_heatmap"))
    st.plotly_chart(translation_figures.cross_grid_figure(tr.cross_attentions, tr.source_tokens, tr.target_tokens),
                    key=key("cross_grid"))


def alignment_lines(model, tr):
    c = model.cfg
    layer = st.selectbox("Layer", index=c.n_dec_layers - 1, **shared_view.linked(key("align_layer"), options=range(c.n_dec_layers)))
    tgt_words, src_words, m = alignment.word_alignment(tr.cross_attentions[layer].mean(0),
                                                       tr.source_tokens, tr.target_tokens)
    st.caption("Source words on top, target words below; a line per head-averaged weight ≥ "
               f"{translation_figures.ALIGN_THRESHOLD:g}, the strongest of each target word in red. Lines cross where "
               "the word order changes.")
    st.plotly_chart(translation_figures.alignment_figure(m, src_words, tgt_words, title=f"Layer {layer}, average of heads"),
                    key=key("align_fig"))


def steps(model, tr):
    c = model.cfg
    if tr.n_tgt > 1:
        step = st.slider("Step", value=0, **shared_view.linked(key("step"), bounds=(0, tr.n_tgt - 1)))
    else:
        step = 0
    layer = st.selectbox("Layer", index=c.n_dec_layers - 1, **shared_view.linked(key("step_layer"), options=range(c.n_dec_layers)))
    written = tokens.plain("".join(tr.target_tokens[:step])).strip() or "(nothing yet)"
    # markdown bold needs no space inside its stars: the label's word space is dropped
    st.markdown(f"Written so far: **{plain(written)}** — now choosing **{plain(tr.target_tokens[step].strip())}** "
                f"(log-probability {float(tr.logprobs[step]):.3f})")
    left, right = st.columns(2)
    row = tr.cross_attentions[layer, :, step].mean(0)
    left.plotly_chart(translation_figures.source_row_figure(row, tr.source_tokens,
                                             title=f"Cross-attention at step {step} (layer {layer}, head average)"),
                      key=key("step_row"))
    label = model.pieces.label if model.pieces else str
    pieces = [label(int(i)) for i in tr.top_ids[step]]
    right.plotly_chart(attention_figures.bar_topk(pieces, tr.top_logprobs[step].exp(), title="Top-10 next pieces"),
                       key=key("step_top"))


def encoder(model, tr):
    c = model.cfg
    st.caption("The encoder's self-attention over the source, with the Attention page's views.")
    st.plotly_chart(attention_figures.overview_figure(tr.encoder_attentions), key=key("enc_overview"))
    c1, c2 = st.columns(2)
    layer = c1.selectbox("Layer", index=c.n_enc_layers - 1, **shared_view.linked(key("enc_layer"), options=range(c.n_enc_layers)))
    head = c2.selectbox("Head", **shared_view.linked(key("enc_head"), options=range(c.n_heads)))
    st.plotly_chart(attention_figures.head_heatmap(tr.encoder_attentions[layer, head], tr.source_tokens,
                                     title=names.head_name(layer, head)), key=key("enc_heatmap"))
    st.plotly_chart(attention_figures.lines_figure(tr.encoder_attentions[layer], tr.source_tokens, [head],
                                     title=attention_figures.lines_title(layer, [head])), key=key("enc_lines"))
    bias = model.position_bias(tr.n_src)
    if bias is not None:   # relative positions: one learned bias per distance, the same in every layer
        st.caption("Part of the map above comes from position alone: this head adds a learned bias for each "
                   "query-key distance to its scores before the softmax, computed once and used by every layer.")
        st.plotly_chart(translation_figures.position_bias_figure(
            bias[head], tr.source_tokens, title=f"head {head}: relative position bias"), key=key("enc_bias"))


@dataclass(frozen=True)
class CrossShape:
    """What the shared head editor reads of a config: the cross-attention heads' grid."""
    n_layers: int
    n_heads: int


def heads_off(model, text: str, beam: int, tr):
    """Switch cross-attention heads off with the shared head editor; show what changes."""
    c = model.cfg
    st.caption("Switch cross-attention heads off (a layer box switches the whole layer), then Apply: the "
               "sentence is translated again.")
    mode = ablation_choice(key("ablation"), "this sentence's translation",
                           " Mean keeps the head's average signal and removes only what depends on the position.")
    head_editor(CrossShape(c.n_dec_layers, c.n_heads), PAGE, model_key=model.info.key,
                effect=lambda keep: masked_effect(model, text, beam, tr, keep, mode), link=True)


def masked_effect(model, text: str, beam: int, tr, keep: torch.Tensor, mode: str = "zero"):
    """The editor's effect: the masked translation's work first, then a callable that draws it."""
    if bool(keep.all()):
        return lambda: st.info("Every head is on: switch some off in the grid (e.g. the layer 1 box), then Apply.")
    try:
        fill = None if mode == "zero" else head_ablation.fill(keep, mode, _means(model.info.key, text, beam, model, tr))
        mk = mask_key(keep, fill)
        masked = _translated(model.info.key, text, beam, mk, model, keep, fill)
        same_text = _traced(model.info.key, text, tuple(tr.target_ids.tolist()), mk, model, keep, fill)
    except ValueError as err:
        message = plain(str(err))
        return lambda: st.error(message)

    def draw():
        st.markdown("**With those heads off:** " + plain(masked.text or "(empty)"))
        st.markdown(diff_markdown(tr.text, masked.text))
        first = alignment.first_difference(tr.target_ids.tolist(), masked.target_ids.tolist())
        c1, c2, c3 = st.columns(3)
        c1.metric("log-probability", f"{masked.logprob:.3f}", f"{masked.logprob - tr.logprob:+.3f}")
        c2.metric("original translation's log-probability", f"{same_text.logprob:.3f}",
                  f"{same_text.logprob - tr.logprob:+.3f}")
        c3.metric("first differing step", "none" if first is None else str(first))
        st.plotly_chart(translation_figures.cross_grid_figure(masked.cross_attentions, masked.source_tokens,
                                               masked.target_tokens, off=np.asarray(keep.numpy() == 0)),
                        key=key("off_grid"))
    return draw


def diff_markdown(before: str, after: str) -> str:
    """Removed words struck through, added words in bold."""
    if before == after:
        return "The translation did not change."
    parts = []
    for kind, words in alignment.word_diff(before, after):
        text = plain(words)
        parts.append(f"~~{text}~~" if kind == "removed" else f"**{text}**" if kind == "added" else text)
    return "Change: " + " ".join(parts)


VIEWS = {
    "Cross-attention": lambda model, text, beam, tr: cross_attention(model, tr),
    "Alignment": lambda model, text, beam, tr: alignment_lines(model, tr),
    "Step through decoding": lambda model, text, beam, tr: steps(model, tr),
    "Encoder self-attention": lambda model, text, beam, tr: encoder(model, tr),
    "Switch heads off": heads_off,
    "Corpus run": lambda model, text, beam, tr: page_tool(PAGE, model),
    "A decoder translating (Gemma, 爱 → love)": prompt_translate_view.view,
}


def views(model, text: str, beam: int, tr):
    """The chosen view only (st.tabs would compute all six on every rerun); the choice is kept
    across buttons, the head editor's Apply and page switches."""
    VIEWS[view_choice(PAGE, list(VIEWS))](model, text, beam, tr)


def page():
    body()
    shared_view.share_bar(PAGE)   # last: the link has every value this run set


def body():
    """The page in reading order: the input, what the model is, the translation, then the chosen view."""
    picked = inputs()
    if picked is None:
        return
    model, text, beam = picked
    explain(model)
    tr = translation(model, text, beam)
    if tr is None:
        return
    summary(model, tr)
    views(model, text, beam, tr)
    with st.expander("Activation patching: a source and a corrupted one"):
        patching_view.translate_view(model, PAGE)
