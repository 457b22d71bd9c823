"""The Lab's positional-encodings view: sinusoidal, learned, rotary and ALiBi tables and their
similarities, and the permutation test (without positions, shuffling the words only permutes the
attention). The permutation test is a heavy job run on a button; what it keeps is one layer."""
from __future__ import annotations

import html
from dataclasses import dataclass

import streamlit as st
import torch

from attnviz.analysis import equivariance, position_tables
from attnviz.base import jobs, names
from attnviz.base.limits import LIMITS
from attnviz.figures import attention_figures
from attnviz.figures import lab_figures
from attnviz.ui import common
from attnviz.ui import job_controls
from attnviz.ui import kept_inputs
from attnviz.ui import shared_view

PAGE = "lab"
SHUFFLE_TEXT = "The cat chased the small mouse across the garden."


def key(name: str) -> str:
    return names.session_key(PAGE, name)


@dataclass
class Shuffled:
    """What the permutation figures need: one layer of both runs, and the differences measured
    over every layer."""
    tokens: list[str]
    order: list[int]             # shuffled position i holds original token order[i]
    layer: int
    original: torch.Tensor       # [H, n, n] float32, the layer's attention in the original order
    shuffled: torch.Tensor       # [H, n, n] float32, of the shuffled input
    plain_diff: float            # without positions: max |shuffled - original permuted|, all layers
    with_pos_diff: float         # the same with the model's own positions
    causal: bool


@st.cache_resource(max_entries=2, show_spinner=False)
def positionless(_model, model_key: str):
    return equivariance.without_positions(_model)


def shuffle(model, text: str, seed: int, layer: int) -> Shuffled:
    """Both permutation tests (without and with positions) under one heavy-job slot and the Lab's
    time limit (checked before every block), keeping one layer of attention (a full result was
    4 x [L, H, n, n]: 1 GB for SmolLM2 at 512 tokens)."""
    deadline = jobs.Deadline(LIMITS.max_lab_seconds, "the permutation test")
    bar = st.progress(0.0, "Running the model without positions, on both orders…")
    try:
        with job_controls.heavy_job("a permutation test") as cancel:
            def check():   # before every block: the time limit, and whether the session is still there
                deadline.check()
                cancel.check()

            plain = equivariance.permutation_test(positionless(model, f"{model.info.key}@{id(model)}"), text,
                                         seed=seed, layers=[layer], check=check)
            bar.progress(0.5, f"Running the model with its {model.cfg.positional} positions…")
            with_pos = equivariance.permutation_test(model, text, order=plain.order, layers=[layer],
                                            check=check)
    finally:
        bar.empty()
    return Shuffled(plain.tokens, plain.order, layer, plain.attentions[0].float(),
                    plain.shuffled[0].float(), plain.max_diff, with_pos.max_diff, plain.causal)


def results():
    """Permutation results of every session, bounded in bytes (one layer each)."""
    return common.shared_cache("lab.permutations", 16, 256)


def permutation_view(model):
    ss = st.session_state
    st.subheader("Without positions, shuffling the words only permutes the attention")
    if model is None:
        st.info("Pick a text model in the sidebar.")
        return
    L = model.cfg.n_layers
    if ss.get(key("perm_layer"), 0) > L - 1:
        ss[key("perm_layer")] = L - 1
    with st.form(key("perm_form")):
        perm_text = st.text_input("Sentence to shuffle", SHUFFLE_TEXT, key=key("perm_text"),
                                  help=f"the first {LIMITS.lab_max_tokens} tokens are used", **kept_inputs.kept())
        c1, c2 = st.columns(2)
        seed = c1.number_input("Shuffle seed", value=0, **shared_view.linked(key("perm_seed"), bounds=(0, 999)))
        layer = c2.number_input("Layer shown", value=0, **shared_view.linked(key("perm_layer"), bounds=(0, L - 1)))
        go = st.form_submit_button("Shuffle and compare", key=key("perm_go"))
    wanted = (f"{model.info.key}@{id(model)}", perm_text, int(seed), int(layer))
    if go:
        try:
            results().put(wanted, shuffle(model, perm_text, int(seed), int(layer)))
            ss[key("perm_for")] = wanted
        except jobs.JobTimeout as err:
            st.error(common.plain(f"{err}. Use a shorter sentence."))
        except ValueError as err:
            st.error(common.plain(str(err)))
    result = results().get(ss.get(key("perm_for")))
    if result is None:
        st.info("Press Shuffle and compare: the model runs on the sentence and on a shuffled copy, "
                "once without positions and once with them.")
        return
    draw_permutation(model, result)


def draw_permutation(model, result: Shuffled):
    shuffled_tokens = [result.tokens[i] for i in result.order]
    st.markdown(common.plain("Shuffled: " + " ".join(shuffled_tokens)))
    m1, m2 = st.columns(2)
    m1.metric("Without positions: max |difference|", f"{result.plain_diff:.1e}")
    m2.metric(f"With {model.cfg.positional} positions: max |difference|", f"{result.with_pos_diff:.3f}")
    if result.causal:
        st.warning("This model is causal: its mask itself tells positions apart, so even without "
                   "positional encodings shuffling changes the attention. Pick an encoder (minilm) "
                   "to see exact equivariance.")
    else:
        st.success("Without positions the shuffled sentence's attention is the original one with rows "
                   f"and columns permuted, to {result.plain_diff:.0e} (float64 rounding). The model "
                   "cannot tell word order; positional encodings are what tell it.")
    H = result.original.shape[0]
    p_head = st.slider(f"Head (layer {result.layer})", 0, H - 1, 0, key=key("perm_head"))
    back_idx = torch.argsort(torch.tensor(result.order))
    back = result.shuffled[p_head][back_idx][:, back_idx]
    c1, c2, c3 = st.columns(3)
    c1.plotly_chart(attention_figures.head_heatmap(result.original[p_head], result.tokens, title="original order"),
                    key=key("perm_a"))
    c2.plotly_chart(attention_figures.head_heatmap(result.shuffled[p_head], shuffled_tokens, title="shuffled"),
                    key=key("perm_b"))
    c3.plotly_chart(attention_figures.head_heatmap(back, result.tokens, title="shuffled, put back in order"),
                    key=key("perm_c"))


def positions_view(model):
    n_pos = st.slider("Positions shown", value=64, step=8, **shared_view.linked(key("npos"), bounds=(8, 256)))
    d_sin = st.select_slider("Sinusoidal width d", value=128, **shared_view.linked(key("dsin"), options=[16, 32, 64, 128, 256, 384]))
    sin = position_tables.sinusoidal_table(n_pos, d_sin)
    sim_sin = position_tables.cosine_similarity(sin)
    curves = {"sinusoidal": position_tables.by_distance(sim_sin)}
    c1, c2 = st.columns(2)
    c1.plotly_chart(lab_figures.table_figure(sin, "Sinusoidal: PE[p, 2i] = sin(p/10000^(2i/d)), "
                                         "PE[p, 2i+1] = cos(…)"), key=key("sin"))
    c2.plotly_chart(lab_figures.similarity_figure(sim_sin, "Sinusoidal: cosine similarity of positions"),
                    key=key("sin_sim"))
    table = position_tables.learned_table(model) if model is not None else None
    if table is not None:
        table = table[:n_pos]
        sim_learned = position_tables.cosine_similarity(table)
        name = html.escape(model.info.key)
        curves[f"learned ({name})"] = position_tables.by_distance(sim_learned)
        c1, c2 = st.columns(2)
        c1.plotly_chart(lab_figures.table_figure(table, f"Learned: {name}'s position table"), key=key("learned"))
        c2.plotly_chart(lab_figures.similarity_figure(sim_learned, "Learned: cosine similarity of positions"),
                        key=key("learned_sim"))
    else:
        st.caption("The model in the sidebar has no learned position table (pick minilm to see one).")
    rotary = model is not None and model.cfg.positional == "rotary"
    d_rope, theta = (model.cfg.d_head, model.cfg.rope_theta) if rotary else (64, 1e5)
    rope_sim = position_tables.rope_similarity(n_pos, d_rope, theta)
    curves[f"rotary (d_head {d_rope}, θ {theta:g})"] = position_tables.by_distance(rope_sim)
    c1, c2 = st.columns(2)
    c1.plotly_chart(lab_figures.table_figure(position_tables.rope_angles(n_pos, d_rope, theta),
                                    f"Rotary: angle of each pair (d_head {d_rope}, θ = {theta:g}"
                                    f"{', SmolLM2' if not rotary else ''})", x_title="pair"),
                    key=key("rope"))
    c2.plotly_chart(lab_figures.similarity_figure(rope_sim, "Rotary: q·k of one vector at positions i and j"),
                    key=key("rope_sim"))
    n_alibi = model.cfg.n_heads if model is not None else 8
    alibi = position_tables.alibi_table(n_pos, n_alibi)
    c1, c2 = st.columns(2)
    c1.plotly_chart(lab_figures.matrix_figure(alibi[0], f"ALiBi: score bias of head 0 of {n_alibi} "
                                               "(−slope × distance)",
                                     row_title="query", col_title="key", height=420), key=key("alibi"))
    c2.plotly_chart(lab_figures.distance_curves_figure({f"head {h}": alibi[h, -1].flip(0) for h in range(n_alibi)},
                                              "score bias", "ALiBi: bias against distance per head"),
                    key=key("alibi_lines"))
    st.plotly_chart(lab_figures.distance_curves_figure(curves, "mean similarity",
                                              "Position-to-position similarity against distance"),
                    key=key("curves"))
    permutation_view(model)
