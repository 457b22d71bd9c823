"""The Readouts page: logit lens, direct logit attribution (with heads switched off live),
generation (attnviz.ui.generation_view) and two prompts side by side. Only the chosen view computes."""
from __future__ import annotations

import streamlit as st
import torch

from attnviz.analysis import head_ablation, prompt_pair, readouts
from attnviz.analysis.effects import TOKEN_CHARS, single_token, token_names
from attnviz.base import exports, names
from attnviz.base.limits import LIMITS
from attnviz.figures import attention_figures
from attnviz.figures import readout_figures
from attnviz.ui import common, generation_view, head_editor, job_controls, kept_inputs, patching_view, shared_view
from attnviz.ui.common import plain

PAGE = "readouts"
VIEWS = ["Logit lens", "Attribution", "Generation", "Two prompts", "Patching"]
DEFAULT_TEXT = "When Mary and John went to the store, John gave a drink to"
SAMPLE_TARGETS = (" Mary", " John")   # the indirect object and the subject: the sample's question
# The two differ before the words that read them: a causal model's attention at the last "it" sees
# "big" or "small" (when they were the last words, every position before them attended alike).
PAIR = ("The trophy didn't fit in the suitcase because it was too big, so it",
        "The trophy didn't fit in the suitcase because it was too small, so it")
FROZEN_NOTE = ("Direct logit attribution, as TransformerLens computes it: the final norm's scale is frozen at "
               "the value the full residual gives it (1/RMS here), which makes the norm linear, so every "
               "part's contribution adds up to the logit difference. A part's direct effect is not its total "
               "effect: later layers also read what it writes (switch heads off below to see that).")


def key(name: str) -> str:
    return names.session_key(PAGE, name)


def results():
    return common.shared_cache("readouts.results", 16, LIMITS.result_cache_mb / 4)


def model_id(model) -> str:
    return f"{model.info.key}@{id(model)}"


@st.cache_resource(show_spinner=False)
def _means() -> dict:
    return {}


def head_means(model) -> torch.Tensor:
    """The heads' mean outputs over the evaluation text, once per model for the server (a few
    models' worth: [L, H, d_head] each)."""
    store, mid = _means(), model_id(model)
    if mid not in store:
        with st.spinner("Mean ablation: every head's mean output over the evaluation text (once per model)…"), \
                job_controls.heavy_job("the heads' means") as cancel:
            means = head_ablation.head_means(model, check=cancel.check)
        while len(store) >= LIMITS.model_cache_entries:
            store.pop(next(iter(store)))
        store[mid] = means
    return store[mid]


def default_text(model) -> str:
    task = getattr(model, "task", None)
    return task.example_prompt() if task is not None else DEFAULT_TEXT


def page():
    model = common.model_picker(tasks=("encoder", "lm"), default="smollm2")
    if model is None:
        st.stop()
    if model.kind == "encoder":
        st.caption("An encoder has no next-token logits: of this page's views, patching (with an embedding "
                   "metric) is the one that applies.")
    views = VIEWS if model.cfg.task != "encoder" else ["Patching"]
    # an encoder has only Patching: a language model picked after it opens on its first view, not on
    # the one view the encoder forced (a view the user chose for a language model is kept)
    was = st.session_state.get(key("view_model"))
    if was is not None and was != model.info.key and st.session_state.get(key("view_forced")):
        st.session_state[names.session_key(PAGE, "view")] = views[0]
    st.session_state[key("view_model")], st.session_state[key("view_forced")] = model.info.key, len(views) == 1
    view = common.view_choice(PAGE, views)
    try:
        if view == "Patching":
            patching_view.view(model, PAGE)
            return
        if view == "Two prompts":
            pair_view(model)
            return
        text = prompt(model)
        if not text.strip():
            st.info("Type a prompt.")
            return
        if view == "Logit lens":
            lens_view(model, text)
        elif view == "Attribution":
            attribution_view(model, text)
        else:
            generation_view.view(model, text, PAGE, head_means)
    except ValueError as err:
        st.error(plain(err))
    finally:
        shared_view.share_bar(PAGE)   # last: the link has every value this run set


def prompt(model) -> str:
    """The prompt box and its Run button (Ctrl+Enter too): a form, so typing never reruns the
    page. The text is kept across views, pages and reloads (kept_inputs)."""
    # a toy reads its own symbols: its example prompt replaces the text when it is picked
    common.follow_owner(key("text_for"), model.info.key, {key("text"): default_text(model)})
    with st.form(key("prompt_form"), border=False):
        text = st.text_area("Prompt", height=80, help=kept_inputs.LINK_HELP,
                            **shared_view.linked(key("text"), kept_inputs.LINK_CHARS))
        st.form_submit_button("Run", key=key("run"), type="primary")
    return text


# ---------------------------------------------------------------- logit lens
def lens_view(model, text: str):
    lens = common.cached_result(results(), ("lens", model_id(model), text), lambda: readouts.logit_lens(model, text))
    tok = model.tokenizer
    n_rows, n = len(lens.rows), len(lens.tokens)
    chart_key, row_key, pos_key = key("lens_chart"), key("lens_row"), key("lens_pos")
    common.follow_owner(key("lens_owner"), (model_id(model), text), {row_key: n_rows - 1, pos_key: n - 1})
    picked = common.picked_cell(chart_key, n)
    if picked is not None and picked != st.session_state.get(key("lens_picked")):
        st.session_state[key("lens_picked")] = picked
        st.session_state[row_key], st.session_state[pos_key] = picked
    common.keep_in_options({row_key: (range(n_rows), n_rows - 1), pos_key: (range(n), n - 1)})
    top_labels = [token_names(tok, lens.top_ids[r, :, 0].tolist()) for r in range(n_rows)]
    final_labels = token_names(tok, lens.final_ids.tolist())
    last = int(lens.final_ids[-1])
    first = lens.first_top1(last)
    st.caption(f"Each residual (after the embeddings, after each block) through the final norm and the "
               f"unembedding, as if the model stopped there. Text: that layer's top token; colour: the "
               f"probability it gives the model's final prediction at that position. At the last position "
               f"the final prediction {plain(repr(final_labels[-1]))} is first top-1 at "
               f"**{lens.rows[first] if first is not None else 'no layer'}**. Click a cell for its top-10.")
    figure = readout_figures.lens_figure(lens.final_probs, top_labels, lens.top_probs[:, :, 0], lens.tokens, lens.rows,
                              final_labels)
    st.plotly_chart(figure, key=chart_key, on_select="rerun", selection_mode="points", width="stretch")
    left, right = st.columns(2)
    row = left.selectbox("Layer", **shared_view.linked(row_key, format_func=lambda r: lens.rows[r], options=range(n_rows)))
    pos = right.selectbox("Position", **shared_view.linked(pos_key, format_func=lambda j: f"{j}: {lens.tokens[j]}", options=range(n)))
    cell = readouts.cell_top(lens, row, pos, tok)
    st.plotly_chart(attention_figures.bar_topk(list(cell["token"]), cell["probability"].to_numpy(),
                                 f"Top-10 after {lens.rows[row]} at position {pos} ({lens.tokens[pos]})"),
                    key=key("lens_top"), width="stretch")
    st.download_button("Logit lens CSV", lambda: exports.csv_text(readouts.lens_frame(lens, tok)),
                       file_name="logit_lens.csv", mime="text/csv", key=key("lens_csv"), on_click="ignore")


# ---------------------------------------------------------------- attribution
def fitting_targets(model, text: str) -> tuple[str, str]:
    """Target and minus tokens that mean something for this prompt: the sample's names for the
    sample prompt, else the model's two most likely next tokens."""
    if text == DEFAULT_TEXT:
        return SAMPLE_TARGETS
    full = common.cached_result(results(), ("logits", model_id(model), text),
                                lambda: head_ablation.logits(model, text)[-1])
    found = readouts.likely_targets(model.tokenizer, full) + ["", ""]
    return found[0], found[1]


def tokens_asked(model, text: str) -> tuple[int, int | None]:
    """The target and minus boxes. They follow the prompt: a new prompt (or model) sets them to
    fitting tokens for it, which the user may then change."""
    common.follow_owner(key("targets_for"), (model_id(model), text),
                        dict(zip((key("target"), key("minus")), fitting_targets(model, text))))
    left, right = st.columns(2)
    target_text = left.text_input("Target token", help="one token, with its leading space",
                                  **shared_view.linked(key("target"), TOKEN_CHARS))
    minus_text = right.text_input("Minus token (optional)", **shared_view.linked(key("minus"), TOKEN_CHARS))
    st.caption("The tokens follow the prompt: for the sample, its two names; for a prompt of yours, "
               "the model's two most likely next tokens. Type others to attribute those.")
    target, note = single_token(model.tokenizer, target_text)
    minus, note_minus = (None, None) if not minus_text.strip() else single_token(model.tokenizer, minus_text)
    for n in (note, note_minus):
        if n:
            st.caption(plain(n))
    return target, minus


def attribution_view(model, text: str):
    target, minus = tokens_asked(model, text)
    att = common.cached_result(results(), ("dla", model_id(model), text, target, minus),
                        lambda: readouts.attribution(model, text, target, minus))
    label = "logit difference" if minus is not None else "logit"
    a, b, c = st.columns(3)
    a.metric(f"Model's {label}", f"{att.logit_diff:.4f}")
    b.metric("Sum of the parts", f"{att.total:.4f}")
    c.metric("Embeddings + biases", f"{att.embed + att.bias:.4f}")
    st.caption(FROZEN_NOTE + f" Here the sum differs from the model's {label} by {abs(att.total - att.logit_diff):.1e}.")
    st.plotly_chart(readout_figures.head_map(att.heads, f"Direct contribution to the {label} (last position)",
                                  "contribution", diverging=True, mlps=att.mlps),
                    key=key("dla_map"), width="stretch")
    frame = readouts.attribution_frame(att)
    st.dataframe(frame.reindex(frame["contribution"].abs().sort_values(ascending=False).index).head(12),
                 hide_index=True, key=key("dla_table"))
    st.download_button("Attribution CSV", lambda: exports.csv_text(frame), file_name="logit_attribution.csv",
                       mime="text/csv", key=key("dla_csv"), on_click="ignore")
    switch_off(model, text, att, target, minus)


def switch_off(model, text: str, att, target: int, minus: int | None):
    """The top-k heads off in this page's head editor, and what that does to the prediction."""
    cfg, mkey = model.cfg, model.info.key
    st.subheader("Switch the top contributors off")
    left, mid, right = st.columns([1, 2, 2], vertical_alignment="bottom")
    k = left.number_input("k", value=5, **shared_view.linked(key("top_k"), bounds=(1, cfg.n_layers * cfg.n_heads)))
    mode = mid.radio("Ablation", horizontal=True,
                     **shared_view.linked(key("ablation"), format_func=lambda m: f"{m} ablation", options=head_ablation.MODES))
    right.button(f"Switch the top {int(k)} heads off", key=key("top_off"), type="primary",
                 on_click=lambda: head_editor.set_applied(cfg, PAGE, readouts.top_off_mask(att, int(k)), mkey))
    full = common.cached_result(results(), ("logits", model_id(model), text),
                         lambda: head_ablation.logits(model, text)[-1])

    def effect(keep):
        means = head_means(model) if mode == "mean" and not keep.all() else None
        masked = common.cached_result(results(), ("logits", model_id(model), text, mode, tuple(keep.flatten().tolist())),
                               lambda: head_ablation.logits(model, text, keep, mode, means)[-1])

        def draw():
            def diff(lg):
                return float(lg[target] - (lg[minus] if minus is not None else 0))
            p_full, p_masked = (float(lg.softmax(-1)[target]) for lg in (full, masked))
            one, two = st.columns(2)
            one.metric("Logit difference" if minus is not None else "Logit", f"{diff(masked):.3f}",
                       f"{diff(masked) - diff(full):+.3f} from {diff(full):.3f}")
            two.metric("p(target)", f"{p_masked:.3f}", f"{p_masked - p_full:+.3f} from {p_full:.3f}")
            top = token_names(model.tokenizer, [int(full.argmax()), int(masked.argmax())])
            st.caption(f"{head_ablation.describe(mode).capitalize()}. Top-1: {plain(top[0])} with every head on, "
                       f"{plain(top[1])} with this mask.")
        return draw

    head_editor.head_editor(cfg, PAGE, att.heads, model_key=mkey, effect=effect, score_label="logit attribution",
                            link=True)
    st.button("Use this mask on the Heads page", key=key("to_heads"),
              on_click=lambda: head_editor.set_applied(cfg, "heads", head_editor.applied_mask(cfg, PAGE, mkey), mkey))


# ---------------------------------------------------------------- two prompts
def pair_view(model):
    for name, default in zip(("pair_a", "pair_b"), PAIR):
        if key(name) not in st.query_params:    # a reload keeps the pair in the link
            st.session_state.setdefault(key(name), default)
    with st.form(key("pair_form"), border=False):
        left, right = st.columns(2)
        text_a = left.text_area("First prompt", height=80, **shared_view.linked(key("pair_a"), kept_inputs.LINK_CHARS))
        text_b = right.text_area("Second prompt", height=80, **shared_view.linked(key("pair_b"), kept_inputs.LINK_CHARS))
        st.form_submit_button("Compare", key=key("pair_go"), type="primary")
    if not text_a.strip() or not text_b.strip():
        st.info("Type two prompts.")
        return
    pair = common.cached_result(results(), ("pair", model_id(model), text_a, text_b),
                         lambda: prompt_pair.compare_prompts(model, text_a, text_b))
    st.caption("How much each head's pattern differs between the prompts: the mean over query rows of the "
               "total-variation distance between the two rows (0 = the same, 1 = nothing in common). A causal "
               "model's rows before the first different token are identical, so only the rows from there on "
               "add to it." + (f" {pair.note}" if pair.note else " Both have as many tokens: compared position by position."))
    st.plotly_chart(readout_figures.head_map(pair.difference, "Pattern difference per head", "difference"),
                    key=key("pair_map"), width="stretch")
    layer0, head0, _ = pair.top(1)[0]
    L, H = model.cfg.n_layers, model.cfg.n_heads
    common.follow_owner(key("pair_owner"), (model_id(model), text_a, text_b),
                        {key("pair_layer"): layer0, key("pair_head"): head0})
    common.keep_in_options({key("pair_layer"): (range(L), layer0), key("pair_head"): (range(H), head0)})
    one, two = st.columns(2)
    layer = one.selectbox("Layer", **shared_view.linked(key("pair_layer"), options=range(L)))
    head = two.selectbox("Head", **shared_view.linked(key("pair_head"), options=range(H)),
                         help="opens on the head whose pattern differs most")
    name = names.head_name(layer, head)
    cols = st.columns(2)
    for j, col in enumerate(cols):
        col.plotly_chart(attention_figures.head_heatmap(pair.attentions[j][layer, head], pair.tokens[j], title=f"{name}, prompt {j + 1}",
                                          causal=model.cfg.causal), key=key(f"pair_head_{j}"), width="stretch")
    st.download_button("Differences CSV", lambda: exports.csv_text(prompt_pair.difference_frame(pair)),
                       file_name="prompt_pair.csv", mime="text/csv", key=key("pair_csv"), on_click="ignore")
