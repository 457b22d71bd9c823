"""The Readouts page's Generation view: generate, step back and forth through each token's
candidates and attention rows, and compare with the heads switched off in the page's editor."""
from __future__ import annotations

import streamlit as st

from attnviz.analysis import head_ablation, generation
from attnviz.analysis.effects import token_names
from attnviz.base import exports, names
from attnviz.base.limits import LIMITS
from attnviz.figures import attention_figures
from attnviz.figures import readout_figures
from attnviz.ui import head_editor, job_controls
from attnviz.ui.common import plain


def continuation(text: str) -> str:
    """The generated text in bold after the prompt: markdown bolds nothing that starts with a space
    or spans a line break, so the space goes before the stars and line breaks show as ⏎."""
    shown = plain(text.strip()).replace("\n", " ⏎ ")
    return (" " if text[:1].isspace() else "") + (f"**{shown}**" if shown else "")


def view(model, text: str, page: str, head_means):
    """`head_means(model)`: the heads' means for mean ablation (computed once per model by the page)."""
    def key(name):
        return names.session_key(page, f"gen_{name}")

    cfg, tok = model.cfg, model.tokenizer
    mask = head_editor.applied_mask(cfg, page, model.info.key)
    n_off = int((mask < 1).sum())
    with st.form(key("form"), border=False):
        c = st.columns(5)
        max_new = c[0].number_input("Tokens", 1, LIMITS.max_generate_tokens, min(20, LIMITS.max_generate_tokens),
                                    key=key("n"))
        temperature = c[1].number_input("Temperature", 0.0, 5.0, 0.0, 0.1, key=key("temperature"),
                                        help="0 = greedy (the most probable token each step)")
        top_k = c[2].number_input("Top-k", 0, 1000, 0, key=key("top_k"), help="0 = no cut")
        top_p = c[3].number_input("Top-p", 0.01, 1.0, 1.0, 0.05, key=key("top_p"))
        seed = c[4].number_input("Seed", 0, 10_000, 0, key=key("seed"))
        compare = st.checkbox(f"Also generate with the {n_off} head(s) switched off in the Attribution view's "
                              "head editor", key=key("compare"), disabled=n_off == 0)
        mode = st.radio("Ablation of those heads", head_ablation.MODES, key=key("ablation"), horizontal=True,
                        format_func=lambda m: f"{m} ablation")
        go = st.form_submit_button("Generate", type="primary", key=key("go"))
    if go:
        settings = dict(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p), seed=int(seed))
        cancel = job_controls.session_cancel()
        with st.spinner("Generating…"):
            full = generation.generate(model, text, int(max_new), cancel=cancel, **settings)
            masked = None
            if compare and n_off:
                means = head_means(model) if mode == "mean" else None
                masked = generation.generate(model, text, int(max_new), head_mask=mask, ablation=mode, means=means,
                                           cancel=cancel, **settings)
        st.session_state[key("result")] = (model.info.key, text, full, masked)
        st.session_state[key("step")] = 0
    result = st.session_state.get(key("result"))
    if result is None or result[:2] != (model.info.key, text):
        st.caption("Greedy by default (temperature 0). Each step shows its top-10 candidates and where the "
                   "query that predicted the token looked, in every head of a layer.")
        return
    _, _, full, masked = result
    runs = [("every head on", full)] + ([(f"{masked.settings['heads_off']} head(s) off, "
                                          f"{masked.settings['ablation']} ablation", masked)] if masked else [])
    for label, gen in runs:
        st.markdown(f"**{plain(label)}:** {plain(text)}{continuation(gen.text(tok))}")
        if gen.stopped != "length":
            st.caption({"eos": "stopped at the end-of-text token", "positions": "stopped at the model's positions",
                        "time": f"stopped at the time limit ({LIMITS.max_generate_seconds:g} s)"}[gen.stopped])
    if masked is not None:
        j = generation.first_difference(full, masked)
        st.caption("The two continuations agree on every step." if j is None else
                   f"The continuations first differ at step {j}.")
    show = st.radio("Steps of", [label for label, _ in runs], key=key("run"), horizontal=True) if masked else runs[0][0]
    gen = dict(runs)[show]
    n = len(gen.steps)
    state = key("step")
    st.session_state[state] = min(int(st.session_state.get(state, 0)), n - 1)
    back, slider, forward = st.columns([1, 8, 1], vertical_alignment="bottom")
    back.button("◀", key=key("back"), disabled=st.session_state[state] <= 0,
                on_click=lambda: st.session_state.update({state: st.session_state[state] - 1}))
    forward.button("▶", key=key("forward"), disabled=st.session_state[state] >= n - 1,
                   on_click=lambda: st.session_state.update({state: st.session_state[state] + 1}))
    if n > 1:
        j = slider.slider("Step", 0, n - 1, key=state)
    else:
        j = 0
    step = gen.steps[j]
    chosen = token_names(tok, [step.token])[0]
    left, right = st.columns(2)
    tops = token_names(tok, step.top_ids)
    left.plotly_chart(attention_figures.bar_topk(tops, step.top_probs, f"Step {j}: chose {chosen} (p = {step.prob:.3f})"),
                      key=key("bars"), width="stretch")
    layer = right.selectbox("Layer", range(cfg.n_layers), index=cfg.n_layers - 1, key=key("layer"))
    keys = generation.step_tokens(gen, tok)[:step.attention.shape[-1]]
    right.plotly_chart(readout_figures.rows_figure(step.attention[layer], keys,
                                        f"Layer {layer}: where the query that predicted {chosen} looked"),
                       key=key("rows"), width="stretch")
    st.download_button("Steps CSV", lambda: exports.csv_text(generation.steps_frame(gen, tok)),
                       file_name="generation.csv", mime="text/csv", key=key("csv"), on_click="ignore")
