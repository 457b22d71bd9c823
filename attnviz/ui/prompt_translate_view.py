"""The Translate page's view of a decoder translating: Gemma 3 270M continues a two-shot prompt
("English: …\\nChinese: …"), and the query that wrote each Chinese token is read over the English
words, beside the bundled en→pt encoder-decoder's cross-attention on the same sentence."""
from __future__ import annotations

import streamlit as st

from attnviz.analysis import prompt_translation
from attnviz.base import names
from attnviz.core import tokens
from attnviz.figures import translation_figures
from attnviz.ui import common
from attnviz.ui import job_controls

PAGE = "translate"
DECODER = "gemma3-270m"         # the bundled decoder that writes Chinese
ENCODER_DECODER = "en-pt"       # the bundled encoder-decoder that reads English
DEFAULT_SENTENCE = "I love you."
DEFAULT_CHARACTER = "爱"         # the target the view opens on, where the sentence has it
EXPLAIN = (
    "**A decoder translating, not an encoder-decoder.** Gemma 3 270M has no encoder: it reads the two "
    "examples, the English sentence and what it has written so far as one sequence, and continues it. "
    "The weights below are its **self-attention**: the row of the query that wrote each Chinese token, "
    "read over the English sentence's words only (the rest of the row goes to the examples, the labels "
    "and the start token). The en→pt model beside it is an **encoder-decoder**: its decoder's "
    "**cross-attention** reads the encoder's output of the English sentence, a separate sequence, and "
    "each row sums to 1 over it — the version the page's other views show.")


def key(name: str) -> str:
    return names.session_key(PAGE, f"pt_{name}")


@st.cache_resource(max_entries=8, show_spinner=False)
def _decoded(sentence: str, _model) -> prompt_translation.PromptTranslation:
    return prompt_translation.translate(_model, sentence, cancel=job_controls.session_cancel())


@st.cache_resource(max_entries=8, show_spinner=False)
def _crossed(sentence: str, _model) -> prompt_translation.CrossRows:
    return prompt_translation.cross_rows(_model.translate(sentence))


def target_name(result: prompt_translation.PromptTranslation):
    """format_func of the target selector; a token that holds several characters says so."""
    def name(i: int) -> str:
        label = result.target_tokens[i]
        chars = len(label.lstrip("".join(tokens.LEADING_SPACE_MARKS)).removesuffix("…"))
        return f"{i}: {label}" + (f" (one token, {chars} characters)" if chars > 1 and not label.endswith("…") else "")
    return name


def view(*_page_translation):
    """The view (the page's own model and translation are not used: this view brings its two)."""
    st.markdown(EXPLAIN)
    sentence = st.text_input("English sentence", DEFAULT_SENTENCE, key=key("sentence"), max_chars=200)
    try:
        with st.spinner(f"Loading {DECODER} (its first load converts the file: about 90 s; then seconds) "
                        "and writing the translation…"):
            result = _decoded(sentence, common.shared_model(DECODER))
    except ValueError as err:
        st.error(common.plain(str(err)))
        return
    left, right = st.columns(2)
    with left:
        decoder_column(result)
    with right:
        cross_column(sentence, result)


def decoder_column(result: prompt_translation.PromptTranslation):
    st.markdown(f"**Decoder: {DECODER}, self-attention over the prompt**")
    st.caption("The prompt, as the model reads it:")
    st.code(result.prompt, language=None)
    if not result.target_tokens:
        st.info("The model wrote nothing before a line break: try a shorter sentence.")
        return
    st.markdown(f"It continues: **{common.plain(result.text)}**")
    ss = st.session_state
    opening = result.target_holding(DEFAULT_CHARACTER)
    common.follow_owner(key("for"), result.prompt, {key("target"): opening if opening is not None else 0})
    common.keep_in_options({key("target"): (range(len(result.target_tokens)), 0)})
    target = st.selectbox("Target token (the query that wrote it)", range(len(result.target_tokens)),
                          key=key("target"), format_func=target_name(result))
    best_layer, best_head, best_word = result.best_head(target)
    # a new target preselects its best head: the one with the most weight on a single English word
    common.follow_owner(key("head_for"), (result.prompt, target), {key("layer"): best_layer, key("head"): best_head})
    n_layers, n_heads = result.rows.shape[1:3]
    c1, c2 = st.columns(2)
    layer = c1.selectbox("Layer", range(n_layers), key=key("layer"))
    head = c2.selectbox("Head", range(n_heads), key=key("head"))
    row = result.rows[target, layer, head]
    peak = int(row.argmax())
    written = result.target_tokens[target]
    st.plotly_chart(translation_figures.word_row_figure(
        result.source_words, row, f"{written} → English words, layer {layer}, head {head}", highlight=peak),
        key=key("row"))
    on_peak = result.rows[target][..., best_word] / result.rows[target].sum(-1).clamp(min=1e-12)   # (L, H)
    st.markdown(common.plain(
        f"While writing “{written}”, layer {best_layer}, head {best_head} puts "
        f"{float(result.rows[target, best_layer, best_head, best_word]):.2f} of its attention on "
        f"“{result.source_words[best_word]}”, more than any other head gives any English word; "
        f"{int((on_peak > 0.5).sum())} of {n_layers * n_heads} heads give “{result.source_words[best_word]}” "
        "more than half of their weight on the sentence."))
    with st.expander("Each layer's strongest head"):
        st.dataframe(result.per_layer(target), hide_index=True, key=key("layers"),
                     column_config={c: st.column_config.NumberColumn(format="%.3f")
                                    for c in ["weight", *result.word_columns()]})


def cross_column(sentence: str, result: prompt_translation.PromptTranslation):
    st.markdown(f"**Encoder-decoder: {ENCODER_DECODER}, cross-attention**")
    try:
        with st.spinner(f"Translating with {ENCODER_DECODER}…"):
            cross = _crossed(sentence, common.shared_model(ENCODER_DECODER))
    except ValueError as err:
        st.error(common.plain(str(err)))
        return
    st.markdown(f"It translates: **{common.plain(cross.text)}**")
    target = result.target_holding(DEFAULT_CHARACTER)
    target = 0 if target is None else st.session_state.get(key("target"), target)
    word = result.source_words[result.best_head(target)[2]] if result.target_tokens else ""
    found = cross.strongest_on(word)
    if found is None:
        st.caption(f"No target word of this translation looks at “{word}” most.")
        return
    t, layer, head, weight = found
    row = cross.rows[t, layer, head]
    st.plotly_chart(translation_figures.word_row_figure(
        cross.source_words, row, f"{cross.target_tokens[t]} → English words, layer {layer}, head {head}",
        highlight=int(row.argmax())), key=key("cross_row"))
    st.markdown(common.plain(
        f"Writing “{cross.target_words[t]}” (its piece “{cross.target_tokens[t].strip()}”), the decoder's "
        f"cross-attention layer {layer}, head {head} puts {weight:.2f} on “{word}”: the same link, read from "
        "an attention whose keys are the encoder's words only."))
