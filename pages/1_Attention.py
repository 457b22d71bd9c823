"""Attention: paste text, see every layer x head at once, then one head, its lines, statistics,
rollout and the model's own output. Layout only; the work is in attnviz.outputs / analysis / viz."""
import streamlit as st
import torch

from attnviz.analysis import stats as analysis
from attnviz.base import exports
from attnviz.analysis import head_scores
from attnviz.base import jobs
from attnviz.analysis import capture as outputs
from attnviz.base import texts
from attnviz.core import tokens as token_text
from attnviz import ui
from attnviz.figures import attention as viz
from attnviz.base.limits import LIMITS

st.set_page_config(page_title="attnviz · Attention", layout="wide")
st.title("Attention")

DEFAULT_TEXT = "The animal didn't cross the street because it was too tired."
COMPARE_TEXT = "The creature stayed on the pavement because it was exhausted."
OWN = "(your own text)"
ss = st.session_state
ss.setdefault("att_text", DEFAULT_TEXT)       # the text the results below belong to
ss.setdefault("att_good", DEFAULT_TEXT)       # the last text that ran without an error
ss.setdefault("att_good_start", 0)            # ... and its window start
ss.setdefault("att_text_input", ss["att_text"])


@st.cache_resource(show_spinner=False)
def capture_store() -> outputs.LRU:
    """Captures of every session, keyed on (model, text, window start); each <= outputs.full_budget().
    Tensors are shared as they are (cache_data would pickle up to 128 MB on every rerun); nothing
    downstream mutates a capture."""
    return outputs.LRU(LIMITS.trace_cache_entries)


def capture(text: str, start: int) -> outputs.TextCapture:
    """The capture of ``text``: from the shared store, or made now under a progress bar. The work
    runs outside any st.cache_* function, so the bar is live and never replayed from a cache;
    each bar update is also where Streamlit's Stop (or a new Run) interrupts a long scan."""
    key = (model_id, text, start)
    cap = capture_store().get(key)
    if cap is None:
        bar = st.progress(0.0, text="Running the model…")
        note = (" A long text is scanned layer by layer to keep memory bounded; press Stop, or "
                "Run another text, to cancel." if len(text) > 4 * window else "")

        def report(done: int, total: int):
            bar.progress(done / total, text=f"Running the model: layer {done} of {total}.{note}")

        try:
            cap = outputs.capture_text(model, text, start=start, progress=report)
        finally:
            bar.empty()
        capture_store().put(key, cap)
    return cap


@st.cache_data(max_entries=16, show_spinner=False)
def vocabulary_warning(model_id: str, text: str, _model) -> str | None:
    return token_text.vocabulary_warning(_model.tokenizer, text, _model.info.key)


@st.cache_resource(max_entries=4, show_spinner=False)
def analyse(model_id: str, text: str, start: int, causal: bool, _cap):
    """Head statistics and rollout of the captured window (rows renormalised when the window is
    cut out of a longer text: exact for a decoder window starting at token 0)."""
    attn = _cap.attentions if _cap.full else outputs.renormalise_rows(_cap.attentions)
    special = _cap.special[_cap.start: _cap.start + _cap.size]
    return analysis.head_stats(attn, special, causal=causal), analysis.rollout(attn), attn


@st.cache_data(max_entries=8, show_spinner=False)
def head_score_table(model_id: str, seq_len: int, n_seqs: int, seed: int, _model):
    """Previous-token / induction / duplicate-token scores of every head (model-wide, not of the
    text): one server-wide heavy-job slot and the importance time limit while computing."""
    with jobs.heavy_job("head scores"):
        return head_scores.head_scores(_model, seq_len, n_seqs, seed,
                                       deadline=jobs.Deadline(LIMITS.max_importance_seconds, "head scores"))


@st.cache_resource(max_entries=16, show_spinner=False)
def embedding(model_id: str, text: str, _model) -> torch.Tensor:
    return outputs.sentence_embedding(_model.trace(text, attentions=False).hidden)


def token_name(tokens: list[str]):
    """format_func of a token selector: "3: it" (None reads as every token)."""
    return lambda i: "all tokens" if i is None else f"{i}: {viz.token_label(tokens[i])}"


def follow_owner(owner_key: str, owner, defaults: dict):
    """Widget values that belong to ``owner`` (a text, a head) are set to ``defaults`` when the
    owner changes. Assigned, never popped: the browser is told the new value."""
    if ss.get(owner_key) != owner:
        ss.update(defaults)
        ss[owner_key] = owner


def keep_in_options(choices: dict):
    """{key: (options, default)}: a value that is not among the options is set to the default."""
    for state_key, (options, default) in choices.items():
        if ss.get(state_key) not in options:
            ss[state_key] = default


def selected_rows(table_key: str) -> list[int]:
    try:
        return [int(r) for r in ss[table_key]["selection"]["rows"]]
    except (KeyError, TypeError, ValueError):
        return []


def use_sample():
    if ss["att_sample"] != OWN:     # a picked sample runs at once
        ss["att_text_input"] = ss["att_text"] = ss["att_sample"]


model = ui.model_picker(tasks=("encoder", "lm"))
if model is None:
    st.stop()
cfg = model.cfg
model_id = f"{model.info.key}@{id(model)}"

# --- Input ---------------------------------------------------------------------------------------
st.selectbox("Sample sentences", [OWN] + texts.seed_sentences(), key="att_sample",
             on_change=use_sample)
with st.form("att_form"):
    st.text_area("Text", key="att_text_input", height=100,
                 help=f"Up to {min(cfg.max_positions, LIMITS.max_capture_tokens):,} tokens; "
                      "longer text is cut to fit.")
    submitted = st.form_submit_button("Run", type="primary")
if submitted:
    if ss["att_text_input"].strip():
        ss["att_text"] = ss["att_text_input"]
    else:
        st.warning("Type or paste some text, then press Run. "
                   "The result below is for the previous text.")

window = outputs.window_size(cfg.n_layers, cfg.n_heads)
try:
    cap = capture(ss["att_text"], ss.get("att_start", 0))
    ss["att_good"], ss["att_good_start"] = ss["att_text"], ss.get("att_start", 0)
except ValueError as err:    # too long for the time limit, server busy, bad input: keep the last
    st.error(ui.plain(f"{err} (showing the previous text instead)"))
    ss["att_text"] = ss["att_good"]
    try:
        cap = capture(ss["att_good"], ss["att_good_start"])
    except ValueError:
        st.stop()

if (cut := outputs.truncation_message(cap, cfg.max_positions)):
    st.warning(cut)
if model.tokenizer is not None and (oov := vocabulary_warning(model_id, ss["att_text"], model)):
    st.warning(ui.plain(oov))
if not cap.full:
    st.info(f"{cap.n:,} tokens. The overview pools the whole text; the detail views, statistics "
            f"and rollout use the {cap.size} tokens from position {cap.start} (rows renormalised "
            "inside the window), so memory stays bounded.")
    ss["att_start"] = cap.start     # the clipped start the capture actually used
    st.number_input("Window start (token)", 0, cap.n - cap.size, step=max(1, cap.size // 2),
                    key="att_start")
tokens = cap.window_tokens
content = [i for i, special in enumerate(cap.special[cap.start: cap.start + cap.size].tolist())
           if not special] or list(range(cap.size))
# Token choices belong to one text (and window). On a new one they are SET to their defaults,
# never popped: a popped key leaves the browser showing the old label ("After position 50: .")
# while the page uses the default; an assigned value is sent to the browser.
follow_owner("att_pos_for", (model_id, ss["att_text"]), {"att_pos": cap.n - 1})
follow_owner("att_window_for", (model_id, ss["att_text"], cap.start),
             {"att_flow_token": cap.size - 1, "att_line_q": None,
              "att_rank_q": content[-1], "att_rank_k": content[0]})
keep_in_options({"att_pos": (range(cap.n), cap.n - 1),
                 "att_flow_token": (range(cap.size), cap.size - 1),
                 "att_line_q": ([None, *range(cap.size)], None),
                 "att_rank_q": (range(cap.size), content[-1]),
                 "att_rank_k": (range(cap.size), content[0])})
stats, rolled, attn = analyse(model_id, ss["att_text"], cap.start, cfg.causal, cap)
st.caption(f"{cap.n:,} tokens: " + ui.plain(" · ".join(viz.token_label(t) for t in cap.tokens[:200]))
           + (" …" if cap.n > 200 else ""))

# --- Finding heads: every head ranked by one query -> key weight (a selected row picks the head) ---
rank_q, rank_k = ss["att_rank_q"], ss["att_rank_k"]
try:
    ranking, rank_error = analysis.rank_heads(attn, rank_q, rank_k, causal=cfg.causal), None
    ranking = ranking.merge(stats[["layer", "head", "role"]], on=["layer", "head"], how="left")
except ValueError as err:
    ranking, rank_error = None, str(err)
if ss.get("att_rank_for") != (model_id, ss["att_text"], cap.start, rank_q, rank_k):
    ss["att_rank_for"] = (model_id, ss["att_text"], cap.start, rank_q, rank_k)
    ss["att_rank_table"] = {"selection": {"rows": [], "columns": [], "cells": []}}
    ss["att_rank_picked"] = None
rows = selected_rows("att_rank_table")
rank_picked = (tuple(int(v) for v in ranking.loc[rows[0], ["layer", "head"]])
               if ranking is not None and rows and rows[0] < len(ranking) else None)
if rank_picked is not None and rank_picked != ss.get("att_rank_picked"):
    ss["att_layer"], ss["att_head"] = rank_picked
ss["att_rank_picked"] = rank_picked

# --- Head scores (model-wide): a selected row picks the head too --------------------------------
scores = ss.get("att_hs") if ss.get("att_hs_for") == model_id else None
rows = selected_rows("att_hs_table") if scores is not None else []
hs_picked = (tuple(int(v) for v in scores.iloc[rows[0]][["layer", "head"]])
             if scores is not None and rows and rows[0] < len(scores) else None)
if hs_picked is not None and hs_picked != ss.get("att_hs_picked"):
    ss["att_layer"], ss["att_head"] = hs_picked
ss["att_hs_picked"] = hs_picked

# --- Overview: every layer x head; a click or the selectors choose the head ----------------------
# Only a new click moves the selectors; the click stays in the chart's state across reruns.
picked = ui.picked_cell("att_overview", cfg.n_heads)
if picked is not None and picked != ss.get("att_picked"):
    ss["att_layer"], ss["att_head"] = picked
ss["att_picked"] = picked
for state_key, count in (("att_layer", cfg.n_layers), ("att_head", cfg.n_heads)):
    if ss.get(state_key) not in range(count):
        ss[state_key] = 0
st.subheader(f"Every head: {cfg.n_layers} layers × {cfg.n_heads} heads")
st.caption("Click a head in the overview, or choose it below. Hover shows its role.")
col_l, col_h, col_scale = st.columns(3)
layer = col_l.selectbox("Layer", range(cfg.n_layers), key="att_layer")
head = col_h.selectbox("Head", range(cfg.n_heads), key="att_head")
per_head = col_scale.toggle("Scale each head to its own maximum", True, key="att_per_head")
roles = stats.sort_values(["layer", "head"])["role"].to_numpy().reshape(cfg.n_layers, cfg.n_heads)
st.plotly_chart(ui.clickable_overview(viz.overview_figure(
                    cap.overview, per_head=per_head, selected=(layer, head), hover_text=roles)),
                key="att_overview", on_select="rerun", selection_mode="points")

# --- The chosen head --------------------------------------------------------------------------
matrix = cap.attentions[layer, head]
title = f"Layer {layer}, head {head}"
tab_detail, tab_lines, tab_find, tab_stats, tab_scores, tab_roll, tab_out, tab_export = st.tabs(
    ["Detail", "Lines", "Find heads", "Statistics", "Head scores", "Rollout & flow", "Model output",
     "Export"])
with tab_detail:
    st.plotly_chart(viz.head_heatmap(matrix, tokens, title=title, causal=cfg.causal),
                    key="att_detail")
    row = stats[(stats["layer"] == layer) & (stats["head"] == head)].iloc[0]
    st.caption(f"Role: **{row['role']}** · entropy {row['entropy']:.2f} nats · mean distance "
               f"{row['mean_distance']:.1f} tokens · max weight {row['max_weight']:.2f}"
               + (" · collapsed" if row["collapsed"] else "")
               + (" · uniform" if row["uniform"] else ""))

with tab_lines:
    # The lines follow the chosen head; other heads of its layer can be added (reset on a new head).
    follow_owner("att_line_for", (layer, head), {"att_line_extra": []})
    extra = st.multiselect(f"Also draw heads of layer {layer}",
                           [h for h in range(cfg.n_heads) if h != head], key="att_line_extra")
    query = st.selectbox("Only from query", [None] + list(range(len(tokens))), key="att_line_q",
                         format_func=token_name(tokens))
    line_heads = [head, *sorted(h for h in extra if h != head)]
    st.plotly_chart(viz.lines_figure(cap.attentions[layer], tokens, line_heads, query,
                                     title=viz.lines_title(layer, line_heads)), key="att_lines")

with tab_find:
    st.caption("Which heads send one token's attention to another? Pick the query (the token "
               "that looks) and the key (the token looked at): every head is ranked by that "
               "weight. Select a row to open its head above.")
    col_q, col_k = st.columns(2)
    col_q.selectbox("Query token", range(len(tokens)), key="att_rank_q",
                    format_func=token_name(tokens))
    col_k.selectbox("Key token", range(len(tokens)), key="att_rank_k",
                    format_func=token_name(tokens))
    if ranking is None:
        st.info(ui.plain(rank_error))
    else:
        pair = f"{viz.token_label(tokens[rank_q])} → {viz.token_label(tokens[rank_k])}"
        st.dataframe(ranking, hide_index=True, key="att_rank_table", on_select="rerun",
                     selection_mode="single-row",
                     column_config={"weight": st.column_config.ProgressColumn(
                         "weight", format="%.3f", min_value=0.0, max_value=1.0)})
        st.plotly_chart(viz.head_rank_figure(ranking, top=20, title=f"Top heads: {pair}"),
                        key="att_rank_bars")
        st.download_button("Ranking CSV", exports.csv_text(ranking), "head_ranking.csv",
                           "text/csv", key="att_rank_csv")

with tab_stats:
    st.plotly_chart(viz.role_map_figure(stats), key="att_roles")
    st.dataframe(stats, hide_index=True, key="att_table",
                 column_config={c: st.column_config.NumberColumn(format="%.3f")
                                for c in stats.columns if stats[c].dtype.kind == "f"})
    st.download_button("Statistics CSV", exports.csv_text(stats), "head_stats.csv", "text/csv",
                       key="att_csv")

with tab_scores:
    st.caption("Previous-token, induction and duplicate-token scores of every head, measured as "
               "TransformerLens does: on repeated random-token sequences R + R (not on your text). "
               "Induction: attention from the copy to the token after the earlier copy; duplicate: "
               "to the earlier copy itself; previous-token: to the position before. Sort by a "
               "column; select a row to open its head above.")
    if cfg.task != "lm" or not cfg.causal:
        st.info("These scores are defined for causal language models: pick smollm2 in the sidebar.")
    else:
        with st.form("att_hs_form"):
            c_t, c_n, c_s = st.columns(3)
            longest = head_scores.max_seq_len(model)
            seq_len = c_t.number_input("Length T of the random block", 4, longest, min(50, longest),
                                       key="att_hs_T", help=f"4 to {longest} tokens; the sequence is R + R.")
            n_seqs = c_n.number_input("Sequences averaged", 1, 32, 4, key="att_hs_n")
            seed = c_s.number_input("Seed", 0, 2**31 - 1, 0, key="att_hs_seed")
            go = st.form_submit_button("Compute head scores")
        if go:
            try:
                with st.spinner(f"Scoring {cfg.n_layers * cfg.n_heads} heads on {int(n_seqs)} "
                                f"sequences of {2 * int(seq_len)} tokens…"):
                    ss["att_hs"] = head_score_table(model_id, int(seq_len), int(n_seqs), int(seed), model)
                ss["att_hs_for"] = model_id
                ss["att_hs_table"] = {"selection": {"rows": [], "columns": [], "cells": []}}
                scores = ss["att_hs"]
            except ValueError as err:
                st.error(ui.plain(err))
        if scores is None:
            st.info("Press Compute head scores (about 2 s for SmolLM2 at the defaults).")
        else:
            st.dataframe(scores, hide_index=True, key="att_hs_table", on_select="rerun",
                         selection_mode="single-row",
                         column_config={c: st.column_config.ProgressColumn(
                             c, format="%.3f", min_value=0.0, max_value=1.0)
                             for c in ("previous_token", "induction", "duplicate_token")})
            st.download_button("Head scores CSV", exports.csv_text(scores), "head_scores.csv",
                               "text/csv", key="att_hs_csv")

with tab_roll:
    st.plotly_chart(viz.head_heatmap(rolled, tokens, title="Attention rollout through all layers",
                                     causal=cfg.causal), key="att_rollout")
    flow_token = st.selectbox("Follow token", range(len(tokens)), key="att_flow_token",
                              format_func=token_name(tokens))
    st.plotly_chart(viz.token_flow_figure(analysis.token_flow(attn, flow_token), tokens,
                                          title="Where it looks in each layer (heads averaged)"),
                    key="att_flow")

with tab_out:
    if cfg.task == "lm":
        position = st.selectbox("After position", range(cap.n), key="att_pos",
                                format_func=token_name(cap.tokens))
        ids, probs = outputs.next_token_topk(model, cap.hidden[position], k=10)
        st.plotly_chart(viz.bar_topk(outputs.token_names(model, ids), probs,
                                     title=f"Next token after {token_name(cap.tokens)(position)}"
                                           ", top 10"), key="att_topk")
    else:
        other = st.text_input("Compare with", COMPARE_TEXT, key="att_compare")
        if other.strip():
            try:
                mine = outputs.sentence_embedding(cap.hidden)
                score = float(mine @ embedding(model_id, other, model))
                st.metric("Cosine similarity (mean-pooled, normalised embeddings)", f"{score:.3f}")
            except ValueError as err:
                st.error(ui.plain(err))
        else:
            st.info("Type a second sentence to compare.")

with tab_export:
    ui.figure_downloads("Chosen head", matrix, tokens, tokens, title, key="att_head_fig")
    ui.figure_downloads("Rollout", rolled, tokens, tokens, "Attention rollout", key="att_rollout_fig")
    overview_title = (f"{model.info.key}: {cfg.n_layers} layers × {cfg.n_heads} heads, "
                      f"{cap.n:,} tokens" + (", each head scaled to its maximum" if per_head else ""))
    st.download_button("Overview PNG", lambda: viz.overview_png(cap.overview, per_head=per_head,
                                                                 title=overview_title),
                       "overview.png", "image/png", key="att_ov_png")
    st.download_button("Attentions NPZ", lambda: outputs.attention_npz(cap), "attentions.npz",
                       "application/octet-stream", key="att_npz")
    st.download_button("Statistics CSV", exports.csv_text(stats), "head_stats.csv", "text/csv",
                       key="att_csv2")
    st.caption("The NPZ holds the window's attentions [layers, heads, n, n], the pooled overview, "
               "tokens and ids; load it with numpy.load(..., allow_pickle=False).")
