"""Attention: paste text, see every layer x head at once, then one head, its lines, statistics,
rollout and the model's own output. Layout only; the work is in attnviz.outputs / analysis / viz."""
import streamlit as st
import torch

from attnviz import analysis, outputs, texts, ui, viz
from attnviz.limits import LIMITS

st.set_page_config(page_title="attnviz · Attention", layout="wide")
st.title("Attention")

DEFAULT_TEXT = "The animal didn't cross the street because it was too tired."
COMPARE_TEXT = "The creature stayed on the pavement because it was exhausted."
OWN = "(your own text)"
ss = st.session_state
ss.setdefault("att_text", DEFAULT_TEXT)       # the text the results below belong to
ss.setdefault("att_good", DEFAULT_TEXT)       # the last text that ran without an error
ss.setdefault("att_text_input", ss["att_text"])


@st.cache_resource(max_entries=LIMITS.trace_cache_entries, show_spinner=False)  # each <= outputs.FULL_BUDGET
def capture(model_id: str, text: str, start: int, _model) -> outputs.TextCapture:
    # cache_resource, not cache_data: tensors are shared as they are (cache_data would pickle
    # up to 128 MB on every rerun). Nothing downstream mutates a capture.
    return outputs.capture_text(_model, text, start=start)


@st.cache_resource(max_entries=4, show_spinner=False)
def analyse(model_id: str, text: str, start: int, causal: bool, _cap):
    """Head statistics and rollout of the captured window (rows renormalised when the window is
    cut out of a longer text: exact for a decoder window starting at token 0)."""
    attn = _cap.attentions if _cap.full else outputs.renormalise_rows(_cap.attentions)
    special = _cap.special[_cap.start: _cap.start + _cap.size]
    return analysis.head_stats(attn, special, causal=causal), analysis.rollout(attn), attn


@st.cache_resource(max_entries=16, show_spinner=False)
def embedding(model_id: str, text: str, _model) -> torch.Tensor:
    return outputs.sentence_embedding(_model.trace(text, attentions=False).hidden)


def token_name(tokens: list[str]):
    """format_func of a token selector: "3: it" (None reads as every token)."""
    return lambda i: "all tokens" if i is None else f"{i}: {viz.token_label(tokens[i])}"


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
                 help=f"Up to {cfg.max_positions:,} tokens; longer text is cut to fit.")
    submitted = st.form_submit_button("Run", type="primary")
if submitted:
    if ss["att_text_input"].strip():
        ss["att_text"] = ss["att_text_input"]
    else:
        st.warning("Type or paste some text, then press Run. "
                   "The result below is for the previous text.")

try:
    window = outputs.window_size(cfg.n_layers, cfg.n_heads)
    n_chars = len(ss["att_text"])
    note = (" A long text is scanned layer by layer to keep memory bounded: on a small CPU "
            "that takes about a minute per 2,000 tokens." if n_chars > 4 * window else "")
    with st.spinner("Running the model…" + note):
        cap = capture(model_id, ss["att_text"], ss.get("att_start", 0), model)
    ss["att_good"] = ss["att_text"]
except ValueError as err:
    st.error(f"{err} (showing the previous text instead)")
    ss["att_text"] = ss["att_good"]
    cap = capture(model_id, ss["att_text"], 0, model)

if cap.truncated:
    st.warning(f"The text was cut to the model's {cfg.max_positions:,} positions: the last "
               f"{cap.truncated:,} tokens were dropped.")
if not cap.full:
    st.info(f"{cap.n:,} tokens. The overview pools the whole text; the detail views, statistics "
            f"and rollout use the {cap.size} tokens from position {cap.start} (rows renormalised "
            "inside the window), so memory stays bounded.")
    ss["att_start"] = cap.start     # the clipped start the capture actually used
    st.number_input("Window start (token)", 0, cap.n - cap.size, step=max(1, cap.size // 2),
                    key="att_start")
# Choices that belong to an earlier text or model are reset rather than left out of range
# (the browser may hand back a stale value, even as a string, after the options change).
for state_key, options in (("att_flow_token", range(cap.size)), ("att_pos", range(cap.n)),
                           ("att_line_q", [None, *range(cap.size)])):
    if state_key in ss and ss[state_key] not in options:
        ss.pop(state_key)
ss["att_line_heads"] = [h for h in ss.get("att_line_heads", [ss.get("att_head", 0)])
                        if h in range(cfg.n_heads)]
stats, rolled, attn = analyse(model_id, ss["att_text"], cap.start, cfg.causal, cap)
tokens = cap.window_tokens
st.caption(f"{cap.n:,} tokens: " + " · ".join(viz.token_label(t) for t in cap.tokens[:200])
           + (" …" if cap.n > 200 else ""))

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
tab_detail, tab_lines, tab_stats, tab_roll, tab_out, tab_export = st.tabs(
    ["Detail", "Lines", "Statistics", "Rollout & flow", "Model output", "Export"])
with tab_detail:
    st.plotly_chart(viz.head_heatmap(matrix, tokens, title=title, causal=cfg.causal),
                    key="att_detail")
    row = stats[(stats["layer"] == layer) & (stats["head"] == head)].iloc[0]
    st.caption(f"Role: **{row['role']}** · entropy {row['entropy']:.2f} nats · mean distance "
               f"{row['mean_distance']:.1f} tokens · max weight {row['max_weight']:.2f}"
               + (" · collapsed" if row["collapsed"] else "")
               + (" · uniform" if row["uniform"] else ""))

with tab_lines:
    heads = st.multiselect("Heads", range(cfg.n_heads), key="att_line_heads")
    query = st.selectbox("Only from query", [None] + list(range(len(tokens))), key="att_line_q",
                         format_func=token_name(tokens))
    if heads:
        st.plotly_chart(viz.lines_figure(cap.attentions[layer], tokens, sorted(heads), query),
                        key="att_lines")

with tab_stats:
    st.plotly_chart(viz.role_map_figure(stats), key="att_roles")
    st.dataframe(stats, hide_index=True, key="att_table",
                 column_config={c: st.column_config.NumberColumn(format="%.3f")
                                for c in stats.columns if stats[c].dtype.kind == "f"})
    st.download_button("Statistics CSV", stats.to_csv(index=False), "head_stats.csv", "text/csv",
                       key="att_csv")

with tab_roll:
    st.plotly_chart(viz.head_heatmap(rolled, tokens, title="Attention rollout through all layers",
                                     causal=cfg.causal), key="att_rollout")
    flow_token = st.selectbox("Follow token", range(len(tokens)), index=len(tokens) - 1,
                              key="att_flow_token", format_func=token_name(tokens))
    st.plotly_chart(viz.token_flow_figure(analysis.token_flow(attn, flow_token), tokens,
                                          title="Where it looks in each layer (heads averaged)"),
                    key="att_flow")

with tab_out:
    if cfg.task == "lm":
        position = st.selectbox("After position", range(cap.n), index=cap.n - 1, key="att_pos",
                                format_func=token_name(cap.tokens))
        ids, probs = outputs.next_token_topk(model, cap.hidden[position], k=10)
        st.plotly_chart(viz.bar_topk(outputs.token_names(model, ids), probs,
                                     title="Next token, top 10"), key="att_topk")
    else:
        other = st.text_input("Compare with", COMPARE_TEXT, key="att_compare")
        if other.strip():
            try:
                mine = outputs.sentence_embedding(cap.hidden)
                score = float(mine @ embedding(model_id, other, model))
                st.metric("Cosine similarity (mean-pooled, normalised embeddings)", f"{score:.3f}")
            except ValueError as err:
                st.error(str(err))
        else:
            st.info("Type a second sentence to compare.")

with tab_export:
    ui.figure_downloads("Chosen head", matrix, tokens, tokens, title, key="att_head_fig")
    ui.figure_downloads("Rollout", rolled, tokens, tokens, "Attention rollout", key="att_rollout_fig")
    overview_png = lambda: viz.image_png(viz.overview_image(cap.overview, per_head=per_head))  # noqa: E731
    st.download_button("Overview PNG", overview_png, "overview.png", "image/png", key="att_ov_png")
    st.download_button("Attentions NPZ", lambda: outputs.attention_npz(cap), "attentions.npz",
                       "application/octet-stream", key="att_npz")
    st.download_button("Statistics CSV", stats.to_csv(index=False), "head_stats.csv", "text/csv",
                       key="att_csv2")
    st.caption("The NPZ holds the window's attentions [layers, heads, n, n], the pooled overview, "
               "tokens and ids; load it with numpy.load(..., allow_pickle=False).")
