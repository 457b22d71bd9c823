"""Lab › Step by step: one real head recomputed from its block input. Guided (the default), it
follows one query token through Q·Kᵀ, scale, mask, softmax, ·V and W_O, one step at a time, its
row highlighted and one sentence per step; "All steps" shows every stage's matrix at once. A
model's first open in a session, before the user chooses a head, shows the head where "it" looks
most at "animal"."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from attnviz.analysis import guided_steps, head_recompute
from attnviz.base import names
from attnviz.base.limits import LIMITS
from attnviz.figures import lab_figures
from attnviz.figures import step_figures
from attnviz.ui import common
from attnviz.ui import kept_inputs
from attnviz.ui import shared_view

PAGE = "lab"
SENTENCE = "The animal didn't cross the street because it was too tired."
MODES = ("Guided: follow one token", "All steps")
STAGES = (("input", "normed"), ("W_Q", "W_K", "W_V"), ("Q", "K", "V"), ("Q_norm", "K_norm"), ("Q_rot", "K_rot"),
          ("scores", "position_bias", "scaled"), ("c2p", "p2c"), ("mask", "masked"), ("softmax", "weighted"),
          ("W_O", "output"))


def key(name: str) -> str:
    """This page's session-state and widget keys: "lab.<name>"."""
    return names.session_key(PAGE, name)


def model_id(model) -> str:
    return f"{model.info.key}@{id(model)}"


def clamp_choice(model, name: str, upper: int, what: str):
    """A number kept in session state may be out of range after a model change: say so, fix it."""
    value = st.session_state.get(name, 0)
    if value > upper:
        st.warning(common.plain(f"{what} {value} is out of range for {model.info.key} (0..{upper}); "
                            f"showing {what} {upper}."))
        st.session_state[name] = upper


def encoded(model, text: str):
    """Token ids of ``text`` and their number, tokenized once per model and text (a rerun for a
    slider, a head or a mask does not tokenize again)."""
    store = common.shared_cache("lab.ids", 32, 64)
    return common.cached_result(store, (model_id(model), text), lambda: model.encode_text(text)[0])


def trace_states(model, text: str, layer: int):
    """One layer's pattern and every block input, for at most LIMITS.lab_max_tokens tokens (the
    steps hold several n x n matrices); shared by sessions, bounded in bytes; nothing mutates it."""
    ids = encoded(model, text)
    store = common.shared_cache("lab.states", LIMITS.trace_cache_entries, LIMITS.result_cache_mb)
    return common.cached_result(store, (model_id(model), text, layer), lambda: model.trace(
        ids[: LIMITS.lab_max_tokens], states=True, layers=[layer])), len(ids)


def opening_head(model, text: str) -> guided_steps.OpeningHead | None:
    """The head a first walk opens on (`steps.opening_head`), from one trace of every layer, made
    once per model and text for every session; None (L0H0) when the text has no "it" after an
    "animal", or is not the model's kind of text (a toy's symbols)."""
    def make():
        try:
            return (guided_steps.opening_head(model, encoded(model, text)[: LIMITS.lab_max_tokens]),)
        except ValueError:        # the view below says what is wrong with the text
            return (None,)
    store = common.shared_cache("lab.opening", 32, 4)
    return common.cached_result(store, (model_id(model), text), make)[0]   # a 1-tuple: "no pair" is kept too


def chose_head():
    """The user moved the layer or the head: from now on no default overwrites the choice."""
    st.session_state[key("head_chosen")] = True


def open_on_default_head(model, text: str) -> guided_steps.OpeningHead | None:
    """Before the user chooses a layer or head, each model opens (once) on its `opening_head`;
    after a choice nothing is set again. Returns the opening head while it is shown, on its text."""
    ss = st.session_state
    if ss.get(key("head_chosen")):
        return None
    if ss.get(key("opened_on")) != model_id(model):
        found = opening_head(model, text)
        ss[key("layer")], ss[key("head")] = (found.layer, found.head) if found else (0, 0)
        ss[key("opened_on")], ss[key("opening")] = model_id(model), (text, found)
    opened_text, found = ss[key("opening")]
    return found if opened_text == text else None


def opening_caption(found: guided_steps.OpeningHead | None):
    """One line on why this head: its name and the real weight from "it" to "animal"."""
    if found is not None:
        q, k = (common.plain(guided_steps.quoted(found.tokens, i)) for i in (found.query, found.key))
        st.caption(f"Opened on {names.head_name(found.layer, found.head)}, the head where {q} looks "
                   f"most at {k} ({found.weight:.2f}); choose any other above.")


def steps_view(model):
    if model is None:
        st.info("Pick a text model in the sidebar.")
        return
    cfg = model.cfg
    mode = st.radio("Show", **shared_view.linked(key("steps_mode"), options=MODES), horizontal=True,
                    label_visibility="collapsed")
    text = st.text_input("Sentence", SENTENCE, key=key("text"), **kept_inputs.kept())
    opening = open_on_default_head(model, text)
    clamp_choice(model, key("layer"), cfg.n_layers - 1, "layer")
    clamp_choice(model, key("head"), cfg.n_heads - 1, "head")
    c1, c2, c3, c4 = st.columns(4)
    layer = c1.number_input("Layer", **shared_view.linked(key("layer"), bounds=(0, cfg.n_layers - 1)), on_change=chose_head)
    head = c2.number_input("Head", **shared_view.linked(key("head"), bounds=(0, cfg.n_heads - 1)), on_change=chose_head)
    temperature = c3.slider("Temperature", value=1.0, step=0.1, **shared_view.linked(key("temp"), bounds=(0.1, 5.0)),
                            help="divides the scaled scores: < 1 sharpens, > 1 flattens")
    causal = c4.toggle("Causal mask", cfg.causal, key=key(f"causal_{cfg.causal}"),
                       help="queries see only earlier tokens")
    opening_caption(opening)
    try:
        tr, n_text = trace_states(model, text, int(layer))
        if n_text > tr.n:
            st.warning(f"The step-by-step view uses the first {tr.n} of the text's {n_text} tokens.")
        hidden = st.multiselect("Hide keys (mask them for every query)", range(tr.n), key=key("hide"),
                                format_func=lambda i: f"{i}: {tr.tokens[i]}")
        result = head_recompute.head_steps(model, tr, int(layer), int(head), temperature=temperature,
                                causal=causal, hidden_keys=tuple(hidden))
    except ValueError as err:
        st.error(common.plain(str(err)))
        return
    if result.changed:
        st.info(f"Temperature or mask changed: this pattern differs from the one the model "
                f"captured by design (max |difference| {result.max_abs_diff:.3g}). Reset "
                "temperature to 1 and the masks to verify the recomputation.")
    else:
        st.success(f"The recomputation equals the pattern the model captured: max |difference| "
                   f"= {result.max_abs_diff:.2g}. The heads' outputs add up to the attention "
                   f"output to {result.output_diff:.2g}.")
    kv = f" (reads K/V head {result.kv_head})" if cfg.group > 1 else ""
    st.markdown(f"**{names.head_name(layer, head)}: layer {layer}, head {head}{kv}**, {tr.n} tokens, "
                f"d_model {cfg.d_model}, d_head {cfg.d_head}.")
    if mode == MODES[0]:
        guided(result, tr.tokens, causal)
    else:
        every_step(result, tr.tokens, causal)


def every_step(result, tokens: list[str], causal: bool):
    """The table of every step and its heatmaps, one row per stage (Q, K and V side by side)."""
    st.dataframe(pd.DataFrame([dict(step=s.name, shape=" × ".join(map(str, s.shape)),
                                    rows=s.rows, columns=s.cols, note=s.note)
                               for s in result.steps.values()]), hide_index=True)
    for stage in STAGES:
        present = [k for k in stage if k in result.steps]
        for col, k in zip(st.columns(len(present)) if present else (), present):
            col.plotly_chart(lab_figures.step_figure(result.steps[k], tokens, causal), key=key(f"step_{k}"))


def move_step(delta: int):
    """Back / Next: a callback, so the step radio shows the new step in the same rerun."""
    ss = st.session_state
    ss[key("step")] = min(max(ss.get(key("step"), 0) + delta, 0), len(guided_steps.GUIDE) - 1)


def pick_query(tokens: list[str], where) -> int:
    """The followed token: a meaningful one by default ("it"), chosen again only when the tokens
    change (another sentence or model); another layer, head or mask keeps it."""
    common.follow_owner(key("query_for"), tuple(tokens), {key("query"): guided_steps.default_query(tokens)})
    return where.selectbox("Follow the query token", range(len(tokens)), key=key("query"),
                           persist_state="session", format_func=lambda i: f"{i}: {tokens[i]}",
                           help="its row is highlighted in every step")


def pick_step(where) -> int:
    """The step shown, kept for the session (another sentence, head or mode keeps it)."""
    ss, last = st.session_state, len(guided_steps.GUIDE) - 1
    if ss.get(key("step")) not in range(last + 1):
        ss[key("step")] = 0
    step = where.radio("Step", range(last + 1), key=key("step"), horizontal=True,
                       persist_state="session", format_func=lambda i: f"{i + 1} {guided_steps.GUIDE[i][1]}")
    back, fwd, _ = where.columns([1, 1, 4])
    back.button("◀ Back", key=key("back"), on_click=move_step, args=(-1,), disabled=step == 0,
                width="stretch")
    fwd.button("Next ▶", key=key("next"), on_click=move_step, args=(1,), disabled=step == last,
               width="stretch")
    return step


def guided(result, tokens: list[str], causal: bool):
    """One step of the walk: its sentence, its matrix with the query's row outlined, that row's
    bars, and at ·V the weighted value rows adding up to the query's output."""
    pick, walk_through = st.columns([1, 3])
    query = pick_query(tokens, pick)
    step = pick_step(walk_through)
    walk = guided_steps.guide(result, query)
    g = walk[step]
    st.info(f"**Step {step + 1} of {len(walk)} · {g.title}.** {common.plain(g.sentence)}")
    left, right = st.columns([3, 2])
    left.plotly_chart(step_figures.guided_heatmap(result.steps[g.key], tokens, query, causal), key=key("guide_heat"))
    right.plotly_chart(step_figures.guide_bars(g, tokens, query), key=key("guide_bars"))
    if g.key == "weighted":
        st.plotly_chart(step_figures.parts_figure(guided_steps.contributions(result, query),
                                        result.steps["weighted"].value[query], tokens, query),
                        key=key("guide_parts"))
    st.caption("Numbers are the head's own, read from the recomputation verified above; hover a "
               "cell or bar for its exact value. 'All steps' shows every matrix at once.")
