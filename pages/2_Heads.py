"""Heads: switch heads off and watch the outputs change; rank heads; pruning curves; real pruning."""
import time

import streamlit as st
import torch

import attnviz
from attnviz import effects, heads_viz, importance, pruning, ui, viz
from attnviz.limits import LIMITS

LIVE_MAX_TOKENS = LIMITS.live_max_tokens  # the live view keeps [n, vocab] log-probs of both runs: bounded
TASKS = ("encoder", "lm")
ss = st.session_state

st.set_page_config(page_title="Heads · attnviz", layout="wide")
st.title("Heads — switch heads off, rank them, prune for real")

# A shared link opens on its model: set the picker before it is drawn (first visit only).
linked_model = st.query_params.get("model")
if "heads_link_read" not in ss and linked_model in {m.key for m in attnviz.list_models() if m.task in TASKS}:
    ss.setdefault(f"{ui.MODEL_KEY}:{'/'.join(TASKS)}", st.query_params["model"])
model = ui.model_picker(tasks=TASKS)
if model is None:
    st.stop()
L, H, mkey = model.cfg.n_layers, model.cfg.n_heads, model.info.key
lm = importance.is_lm(model)


def head_key(layer, head):
    return f"heads_cb:{mkey}:{layer}:{head}"


def layer_key(layer):
    return f"heads_layer:{mkey}:{layer}"


def set_mask(keep):
    for i in range(L):
        for h in range(H):
            ss[head_key(i, h)] = bool(keep[i][h])


def current_mask() -> torch.Tensor:
    return torch.tensor([[bool(ss[head_key(i, h)]) for h in range(H)] for i in range(L)])


def layer_changed(layer):
    for h in range(H):
        ss[head_key(layer, h)] = bool(ss[layer_key(layer)])


# Streamlit drops a widget's state on runs that do not draw it (another page, another model):
# a plain copy of the mask restores the checkboxes when the user comes back.
saved = pruning.decode_mask(ss[f"heads_saved:{mkey}"], L, H) if f"heads_saved:{mkey}" in ss else None
for i in range(L):
    for h in range(H):
        ss.setdefault(head_key(i, h), True if saved is None else bool(saved[i, h]))
if not ss.get(f"heads_link_read:{mkey}"):  # the mask in a shared link, read once per model
    ss[f"heads_link_read:{mkey}"] = ss["heads_link_read"] = True
    if "heads" in st.query_params:
        try:
            set_mask(pruning.decode_mask(st.query_params["heads"], L, H).tolist())
        except ValueError as err:
            st.warning(str(err))

default_text = ("The capital of France is Paris. The cat sat on the mat because it was tired, and"
                if lm else "The cat sits on the mat.")
text = st.text_area("Text", default_text, key=f"heads_text:{'lm' if lm else 'enc'}", height=80)

# ---------------------------------------------------------------- the mask
with st.expander("Head mask — click a head to switch it off; a layer box switches the whole layer",
                 expanded=True):
    imp_store = ss.get(f"heads_imp:{mkey}")
    p1, p2, p3, p4 = st.columns(4)
    share = p1.slider("k (% of heads kept)", 5, 100, 70, 5, key="heads_k")
    p1.button("Reset: all heads on", key="heads_reset", on_click=set_mask, args=([[True] * H] * L,))
    p2.button("Keep top k% by importance", key="heads_top", disabled=imp_store is None,
              help=None if imp_store else "compute importance below first",
              on_click=lambda: set_mask(imp_store[0].keep_top(
                  share / 100, normalised=ss.get("heads_imp_norm", True)).tolist()))
    seed = p3.number_input("seed", 0, 10_000, 0, key="heads_seed")
    n_keep = max(1, round(share / 100 * L * H))
    p3.button("Keep a random k%", key="heads_random", on_click=lambda: set_mask(
        (torch.randperm(L * H, generator=torch.Generator().manual_seed(int(seed))) < n_keep).view(L, H).tolist()))
    only = p4.selectbox("layer", range(L), index=L - 1, key="heads_only")
    p4.button("Keep this layer only", key="heads_only_btn",
              on_click=lambda: set_mask([[i == only] * H for i in range(L)]))
    cols = st.columns([2] + [1] * H)
    for h in range(H):
        cols[h + 1].caption(f"h{h}")
    keep = current_mask()
    for i in range(L):
        ss[layer_key(i)] = bool(keep[i].all())
        row = st.columns([2] + [1] * H)
        row[0].checkbox(f"layer {i}", key=layer_key(i), on_change=layer_changed, args=(i,))
        for h in range(H):
            row[h + 1].checkbox(f"L{i} H{h}", key=head_key(i, h), label_visibility="collapsed")

keep = current_mask()
ss[f"heads_saved:{mkey}"] = pruning.encode_mask(keep)
st.query_params["model"] = mkey
if keep.all():
    st.query_params.pop("heads", None)
else:
    st.query_params["heads"] = pruning.encode_mask(keep)
n_on = int(keep.sum())
st.caption(f"{n_on} of {L * H} heads on · the mask is yours alone and lives in this page's link")
all_off = n_on == 0
if all_off:
    st.error("Every head is switched off: nothing is left to compare or prune. Turn at least one head "
             "back on (or press Reset); importance and pruning curves below still work.")

live, imp_tab, curve_tab, prune_tab = st.tabs(["Live effect", "Importance", "Pruning curve", "Real pruning"])

# ---------------------------------------------------------------- live effect
SENTENCES = ["A kitten is resting on a rug.", "The dog sleeps on the sofa.", "A man is playing a guitar.",
             "Stock markets fell sharply today.", "The cat is lying on a carpet."]


@st.cache_resource(max_entries=4, show_spinner=False)
def full_outputs(_model, key, ids, layer, sentences):
    """The unmasked side depends only on the text: shared, never mutated."""
    return effects.outputs(_model, list(ids), None, layer, list(sentences))


with live:
    try:
        ids, cut = model.encode_text(text)
    except ValueError as err:
        st.warning(str(err))
        ids = None
    if ids is not None and not all_off:
        if len(ids) > LIVE_MAX_TOKENS:
            st.caption(f"The live view uses the first {LIVE_MAX_TOKENS} of {len(ids)} tokens.")
        ids = tuple(ids[:LIVE_MAX_TOKENS].tolist())
        c1, c2, c3 = st.columns([1, 1, 2])
        layer = c1.selectbox("layer for the attention change", range(L), index=L - 1, key="heads_diff_layer")
        head = c2.selectbox("head", range(H), key="heads_diff_head")
        sentences = () if lm else tuple(s for s in c3.text_area(
            "sentences to rank by similarity (one per line)", "\n".join(SENTENCES),
            key="heads_sentences").splitlines() if s.strip())[:20]
        full = full_outputs(model, mkey, ids, layer, sentences)
        cache_key = (mkey, ids, layer, sentences, pruning.encode_mask(keep))
        if ss.get("heads_masked", (None,))[0] != cache_key:  # one entry, this session only
            ss["heads_masked"] = (cache_key, effects.outputs(model, list(ids), keep.float(), layer, list(sentences)))
        masked = ss["heads_masked"][1]
        cmp = effects.compare(full, masked, list(sentences))
        if lm:
            m1, m2, m3 = st.columns(3)
            m1.metric("perplexity (masked)", f"{cmp['perplexity_masked']:.2f}",
                      f"{cmp['perplexity_masked'] - cmp['perplexity_full']:+.2f} vs full "
                      f"{cmp['perplexity_full']:.2f}", delta_color="inverse")
            m2.metric("KL(full ‖ masked), nats/token", f"{cmp['kl']:.4f}")
            m3.metric("top-1 agreement with the full model", f"{cmp['top1']:.1%}")
            b1, b2 = st.columns(2)
            for col, side, name in ((b1, full, "full model"), (b2, masked, "masked")):
                labels, probs = side.top_k(10, model.tokenizer)
                col.plotly_chart(viz.bar_topk(labels, probs, f"next token — {name}"), key=f"heads_topk_{name}")
            if len(ids) < 2:
                st.info("Type at least two tokens to see the per-token loss and the perplexity.")
            else:
                st.plotly_chart(heads_viz.token_loss_figure(full.tokens, full.token_loss, masked.token_loss),
                                key="heads_token_loss")
        else:
            st.metric("embedding cosine to the full model", f"{cmp['cosine']:.4f}")
            if "ranking" in cmp:
                st.caption(f"Similarity ranking of the sentences to the text: {cmp['rank_changes']} "
                           "sentence(s) change rank under the mask.")
                st.dataframe(cmp["ranking"], hide_index=True, key="heads_ranking")
        st.plotly_chart(heads_viz.difference_heatmap(
            full.attention[head], masked.attention[head], full.tokens, causal=model.cfg.causal,
            title=f"layer {layer}, head {head}: attention masked − full"), key="heads_diff")
        if not keep[:layer].all() or torch.equal(full.attention, masked.attention):
            st.caption("A mask scales a head's output, not its weights: a layer's attention changes only "
                       "through the heads switched off in the layers before it"
                       + ("." if not keep[:layer].all() else f" — every head off is in layer {layer} or later, "
                          "so this map is all zero; pick a later layer."))

# ---------------------------------------------------------------- evaluation text
def eval_settings(tab, prefix):
    c1, c2, c3, c4 = tab.columns(4)
    source = c1.radio("evaluation text", ["bundled (Alice, ch. I–II)", "the text above"], key=f"{prefix}_src")
    tokens = c2.select_slider("tokens", [32, 64, 128, 256, 512, 1024, 2048], 128 if lm else 256,
                              key=f"{prefix}_tokens")
    window = c3.select_slider("window", [32, 64, 128, 256], 64, key=f"{prefix}_window")
    budget = c4.number_input("time budget (s)", 1, 3600, 120, key=f"{prefix}_budget")
    try:
        data = importance.eval_windows(model, None if source.startswith("bundled") else text, tokens, window)
    except ValueError as err:
        tab.warning(str(err))
        return None, budget
    tab.caption(f"{data.n_windows} window(s) of {data.ids.shape[1]} tokens · {data.n_tokens} tokens used"
                f" of {data.available}")
    return data, budget


def run_tracked(tab, store, label, budget, fn):
    """Run fn(progress, should_stop) with a progress bar; every partial result is saved at once, so
    a Cancel click (which interrupts this run) loses nothing."""
    ss[store + ":running"] = True
    cancel = tab.empty()
    cancel.button("Cancel", key=store + ":cancel")
    bar = tab.progress(0.0, text=label)
    start, seen = time.monotonic(), [0]

    def progress(done, total, partial):
        ss[store] = (partial, ss[store + ":budget"])
        seen[0] = done
        bar.progress(done / max(total, 1), text=f"{label}: {done} / {total}")

    ss[store + ":budget"] = budget
    result = fn(progress, lambda: seen[0] > 0 and time.monotonic() - start > budget)
    ss[store] = (result, budget)
    ss[store + ":running"] = False
    cancel.empty()
    bar.empty()


def partial_note(tab, store, what):
    if ss.get(store + ":running"):  # a run was interrupted by a click (Cancel or any widget)
        ss[store + ":running"] = False
        ss[store + ":stopped"] = "cancelled"
    if store in ss and not ss[store][0].complete:
        why = "was cancelled" if ss.get(store + ":stopped") == "cancelled" else \
            f"reached its time budget ({ss[store][1]} s)"
        tab.warning(f"The {what} run {why} after {ss[store][0].done} of {ss[store][0].total} steps: "
                    "the partial result is shown. Run again to finish.")


with imp_tab:
    data, budget = eval_settings(imp_tab, "heads_imp")
    m1, m2, m3 = st.columns(3)
    normalised = m3.toggle("normalise per layer (Michel et al.)", True, key="heads_imp_norm",
                           help="on: each layer's scores divided by their L2 norm (the paper's choice); "
                                "off: raw scores, comparable across layers")
    method = m1.radio("method", ["gradient", "ablation"], key="heads_imp_method", horizontal=True,
                      help="gradient: Michel et al. (2019), |dL/dmask| normalised per layer; ablation: the "
                           "metric change when that head alone is removed (one pass per head)")
    under_mask = m2.checkbox("estimate under the current mask", key="heads_imp_under")
    store = f"heads_imp:{mkey}"
    if st.button("Compute importance", key="heads_imp_go", disabled=data is None or (under_mask and all_off)):
        ss[store + ":stopped"] = None
        run_tracked(imp_tab, store, f"{method} importance", budget, lambda progress, stop: importance.head_importance(
            model, data, method, keep.float() if under_mask else None, progress=progress, should_stop=stop))
    partial_note(imp_tab, store, "importance")
    if store in ss:
        imp = ss[store][0]
        st.caption(f"{imp.method}: {imp.objective}" + ("" if lm or imp.method == "ablation" else
                   ". An encoder's loss 1 − cos sits at its minimum with every head on, where its gradient is "
                   "zero, so the score adds the Gauss-Newton curvature (exact Hessian there)."))
        table = imp.table(normalised)
        if len(table):
            st.plotly_chart(viz.stat_map_figure(table, "score" if normalised else "raw"), key="heads_imp_map")
            st.dataframe(table, hide_index=True, key="heads_imp_table")

with curve_tab:
    data_c, budget = eval_settings(curve_tab, "heads_curve")
    s1, s2, s3 = st.columns(3)
    seeds = s1.number_input("random orders (seeds)", 1, 10, 3, key="heads_curve_seeds")
    curve_method = s2.radio("importance", ["gradient", "ablation"], key="heads_curve_method", horizontal=True,
                            help="re-estimated after every 10% step; ablation costs one pass per head")
    curve_norm = s3.toggle("normalise per layer (Michel et al.)", True, key="heads_curve_norm")
    cstore = f"heads_curve:{mkey}"
    if st.button("Compute pruning curve", key="heads_curve_go", disabled=data_c is None):
        ss[cstore + ":stopped"] = None
        run_tracked(curve_tab, cstore, "pruning curve", budget, lambda progress, stop: pruning.pruning_curve(
            model, data_c, method=curve_method, seeds=tuple(range(int(seeds))), normalised=curve_norm,
            progress=progress, should_stop=stop))
    partial_note(curve_tab, cstore, "pruning-curve")
    if cstore in ss and len(ss[cstore][0].table):
        summary = ss[cstore][0].summary()
        for metric in (("perplexity", "top1") if lm else ("cosine",)):
            st.plotly_chart(heads_viz.curve_figure(summary, metric, log_y=metric == "perplexity"),
                            key=f"heads_curve_{metric}")
        st.dataframe(summary, hide_index=True, key="heads_curve_table")

with prune_tab:
    lengths = st.multiselect("sequence lengths", [16, 32, 64, 128, 256, 512, 1024], [32, 128, 512],
                             key="heads_lengths")
    repeats = st.number_input("runs per length (median)", 1, 20, 3, key="heads_repeats")
    st.caption(f"Prunes the {n_on} heads that are on into a new model; the shared model is not touched.")
    pstore = f"heads_speed:{mkey}"
    if st.button("Prune and measure", key="heads_prune_go", disabled=all_off or not lengths):
        try:
            with st.spinner("Building the pruned model and timing both…"):
                ss[pstore] = (pruning.encode_mask(keep), pruning.measure_speedup(model, keep, lengths, int(repeats)))
        except ValueError as err:
            st.error(str(err))
    if pstore in ss:
        mask_code, sp = ss[pstore]
        if mask_code != pruning.encode_mask(keep):
            st.info("Measured for an earlier mask; press the button to measure this one.")
        c1, c2 = st.columns(2)
        c1.metric("parameters (pruned)", f"{sp.params_pruned / 1e6:.2f} M",
                  f"{(sp.params_pruned - sp.params_full) / 1e6:+.2f} M of {sp.params_full / 1e6:.2f} M")
        c2.metric("heads kept", f"{sp.heads_kept} / {sp.heads_total}")
        modelled = sp.modelled()
        st.plotly_chart(heads_viz.latency_figure(sp.table, modelled), key="heads_latency")
        st.dataframe(sp.table, hide_index=True, key="heads_speed_table")
        st.caption("bound: the most pruning can give when attention takes the measured share of the time "
                   "(Amdahl, 1 / (1 − share × removed fraction)); flops_speedup: the same from FLOP counts.")
        if (sp.table["speedup"] > 1.05 * sp.table["bound"]).any():
            st.caption("⚠ a measured speed-up above its bound is timing noise on a busy machine: raise the "
                       "runs per length.")
        if modelled is None:
            st.info("The Raspberry Pi cost model (attnviz.costmodel) is not available in this build.")
        else:
            st.caption("Raspberry Pi 4 / 5, modelled by attnviz.costmodel (a roofline model, not measured):")
            st.dataframe(modelled, hide_index=True, key="heads_pi_table")
