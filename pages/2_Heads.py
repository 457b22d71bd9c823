"""Heads: switch heads off and watch the outputs change; rank heads; pruning curves; real pruning."""
import streamlit as st
import torch

import attnviz
from attnviz.analysis import effects
from attnviz.base import exports
from attnviz.figures import heads as heads_viz
from attnviz.analysis import importance
from attnviz.base import jobs
from attnviz.analysis import pruning
from attnviz import ui
from attnviz.figures import attention as viz
from attnviz.base.limits import LIMITS

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
shape = f"{mkey}:{L}x{H}"  # settings that name a layer or head are kept per model: they never go stale
lm = importance.is_lm(model)


def row_key(layer):
    """The widget of one layer's heads: the list of heads that are on."""
    return f"heads_row:{mkey}:{layer}"


def layer_key(layer):
    return f"heads_layer:{mkey}:{layer}"


APPLIED = f"heads_applied:{mkey}"  # the mask the results are for; the grid may hold edits not yet applied


def set_mask(keep):
    """Presets, layer boxes and links: the grid and the applied mask at once."""
    for i in range(L):
        ss[row_key(i)] = [h for h in range(H) if keep[i][h]]
    ss[APPLIED] = pruning.encode_mask(torch.as_tensor(keep, dtype=torch.bool))


def current_mask() -> torch.Tensor:
    """The grid as it stands, edits not yet applied included."""
    keep = torch.zeros(L, H, dtype=torch.bool)
    for i in range(L):
        keep[i, [int(h) for h in ss[row_key(i)]]] = True
    return keep


def applied_mask() -> torch.Tensor:
    return pruning.decode_mask(ss[APPLIED], L, H)


def apply_edits():
    ss[APPLIED] = pruning.encode_mask(current_mask())


def layer_changed(layer):
    ss[row_key(layer)] = list(range(H)) if ss[layer_key(layer)] else []
    apply_edits()


# Streamlit drops a widget's state on runs that do not draw it (another page, another model):
# a plain copy of the mask restores the checkboxes when the user comes back.
saved = pruning.decode_mask(ss[f"heads_saved:{mkey}"], L, H) if f"heads_saved:{mkey}" in ss else None
for i in range(L):
    ss.setdefault(row_key(i), [h for h in range(H) if saved is None or saved[i, h]])
ss.setdefault(APPLIED, pruning.encode_mask(current_mask()))
if not ss.get(f"heads_link_read:{mkey}"):  # the mask in a shared link, read once per model
    ss[f"heads_link_read:{mkey}"] = ss["heads_link_read"] = True
    if "heads" in st.query_params:
        try:
            set_mask(pruning.decode_mask(st.query_params["heads"], L, H).tolist())
        except ValueError as err:
            st.warning(ui.plain(str(err)))

default_text = ("The capital of France is Paris. The cat sat on the mat because it was tired, and"
                if lm else "The cat sits on the mat.")
text = st.text_area("Text", default_text, key=f"heads_text:{'lm' if lm else 'enc'}", height=80)

# ---------------------------------------------------------------- live effect helpers
LIVE_CHARTS = ("next token", "per-token loss", "attention change", "all three")
# Streamlit's chart theme is applied in the browser on every redraw (~0.1-0.3 s of the live view's
# redraw, bench/toggle_latency.py): the live charts keep plotly's own look.
LIVE_THEME = dict(theme=None)
SENTENCES = ["A kitten is resting on a rug.", "The dog sleeps on the sofa.", "A man is playing a guitar.",
             "Stock markets fell sharply today.", "The cat is lying on a carpet."]


@st.cache_resource(max_entries=LIMITS.trace_cache_entries, show_spinner=False)
def full_outputs(_model, key, ids, layer, sentences):
    """The unmasked side depends only on the text: shared by every session, never mutated."""
    return effects.outputs(_model, list(ids), None, layer, list(sentences))


def chosen_token(column, label, key, fallback: int, fallback_name: str, placeholder: str):
    """A token the user typed (one token, or a message saying how it tokenizes), else the fallback."""
    typed = column.text_input(label, key=key, placeholder=placeholder)
    if not typed.strip():
        return fallback
    try:
        token, note = effects.single_token(model.tokenizer, typed)
    except ValueError as err:
        column.warning(ui.plain(str(err)) + f" — showing {ui.plain(fallback_name)} instead.")
        return fallback
    if note:
        column.caption(ui.plain(note))
    return token


def last_position_view(full, masked):
    top = full.logprobs[-1].topk(2).indices.tolist()
    names = effects.token_names(model.tokenizer, top)
    t1, t2, t3 = st.columns([1, 1, 2])
    target = chosen_token(t1, "target token", f"heads_target:{mkey}", top[0], names[0],
                          f"e.g. ' Mary' — empty: {names[0]}")
    other = chosen_token(t2, "minus token (logit difference)", f"heads_other:{mkey}", top[1], names[1],
                         f"e.g. ' John' — empty: {names[1]}")
    nums = effects.last_position(full, masked, target, other)
    tn, on = (ui.plain(n) for n in effects.token_names(model.tokenizer, [target, other]))
    t3.metric(f"P({tn}) next, masked", f"{nums['prob_masked']:.1%}",
              f"{100 * (nums['prob_masked'] - nums['prob_full']):+.1f} pts vs full {nums['prob_full']:.1%}")
    t3.metric(f"logit({tn}) − logit({on}), masked", f"{nums['logit_diff_masked']:+.3f}",
              f"{nums['logit_diff_masked'] - nums['logit_diff_full']:+.3f} vs full {nums['logit_diff_full']:+.3f}")
    pf, pm = effects.token_names(model.tokenizer, [nums["top1_full"], nums["top1_masked"]])
    if nums["flipped"]:
        st.warning(f"The next-token prediction flips: the full model predicts {ui.plain(pf)}, the masked "
                   f"model {ui.plain(pm)}. Perplexity alone can hide this.", icon="⚠️")
    else:
        st.caption(f"The next-token prediction stays {ui.plain(pf)}.")


def live_runs(keep):
    """The full and the masked run of the live view, or a message. Both runs happen before
    anything of the live view is drawn: the browser then has nothing to repaint while the model
    runs (on a small machine the two compete for the same cores). The pickers' values come from
    the session state, where Streamlit keeps them between runs."""
    try:
        ids = model.encode_text(text)[0]
    except ValueError as err:
        return str(err)
    n_ids = len(ids)
    ids = tuple(ids[:LIVE_MAX_TOKENS].tolist())
    layer = ss.get(f"heads_diff_layer:{shape}", L - 1)
    sentences = () if lm else tuple(s for s in ss.get("heads_sentences", "\n".join(SENTENCES)).splitlines()
                                     if s.strip())[:20]
    full = full_outputs(model, mkey, ids, layer, sentences)
    cache_key = (mkey, ids, layer, sentences, pruning.encode_mask(keep))
    previous = ss.get("heads_masked")  # one entry, this session only
    if previous is None or previous[0] != cache_key:
        # the run starts at the first layer whose mask differs from the full or the previous run
        bases = [full] + ([previous[1]] if previous is not None and previous[0][:4] == cache_key[:4] else [])
        ss["heads_masked"] = (cache_key, effects.outputs(model, list(ids), keep.float(), layer,
                                                         list(sentences), base=bases))
    return ids, n_ids, layer, sentences, full, ss["heads_masked"][1]


def live_effect(keep, runs):
    if isinstance(runs, str):
        st.warning(ui.plain(runs))
        return
    ids, n_ids, layer, sentences, full, masked = runs
    if n_ids > LIVE_MAX_TOKENS:
        st.caption(f"The live view uses the first {LIVE_MAX_TOKENS} of {n_ids} tokens.")
    c1, c2, c3 = st.columns([1, 1, 2])
    c1.selectbox("layer for the attention change", range(L), index=L - 1, key=f"heads_diff_layer:{shape}")
    head = c2.selectbox("head", range(H), key=f"heads_diff_head:{shape}")
    if lm:
        # Each plotly chart adds to every redraw: one appears 0.6–0.7 s after Apply, all three 0.9–1.1 s
        # (bench/toggle_latency.py, SmolLM2 at 64 tokens).
        chart = c3.segmented_control("chart", LIVE_CHARTS, default=LIVE_CHARTS[0], required=True,
                                     key="heads_chart", help="the chart redrawn after each Apply; "
                                     "all three take about 0.3–0.5 s longer to appear")
    else:
        chart = "attention change"
        c3.text_area("sentences to rank by similarity (one per line)", "\n".join(SENTENCES),
                     key="heads_sentences")
    cmp = effects.compare(full, masked, list(sentences))
    if lm:
        m1, m2, m3 = st.columns(3)
        m1.metric("perplexity (masked)", f"{cmp['perplexity_masked']:.2f}",
                  f"{cmp['perplexity_masked'] - cmp['perplexity_full']:+.2f} vs full "
                  f"{cmp['perplexity_full']:.2f}", delta_color="inverse")
        m2.metric("KL(full ‖ masked), nats/token", f"{cmp['kl']:.4f}")
        m3.metric("top-1 agreement with the full model", f"{cmp['top1']:.1%}",
                  f"{cmp['flipped_positions']} of {len(ids)} positions flip" if cmp["flipped_positions"]
                  else None, delta_color="inverse")
        last_position_view(full, masked)
        if chart in ("next token", "all three"):
            st.plotly_chart(heads_viz.topk_pair(full.top_k(10, model.tokenizer),
                                                masked.top_k(10, model.tokenizer)), key="heads_topk", **LIVE_THEME)
        if chart in ("per-token loss", "all three"):
            if len(ids) < 2:
                st.info("Type at least two tokens to see the per-token loss and the perplexity.")
            else:
                st.plotly_chart(heads_viz.token_loss_figure(full.tokens, full.token_loss, masked.token_loss),
                                key="heads_token_loss", **LIVE_THEME)
    else:
        st.metric("embedding cosine to the full model", f"{cmp['cosine']:.4f}")
        if "ranking" in cmp:
            st.caption(f"Similarity ranking of the sentences to the text: {cmp['rank_changes']} "
                       "sentence(s) change rank under the mask.")
            st.dataframe(cmp["ranking"], hide_index=True, key="heads_ranking")
    if chart in ("attention change", "all three"):
        st.plotly_chart(heads_viz.difference_heatmap(
            full.attention[head], masked.attention[head], full.tokens, causal=model.cfg.causal,
            title=f"layer {layer}, head {head}: attention masked − full"), key="heads_diff", **LIVE_THEME)
        note = effects.attention_note(keep, layer)
        if note:
            st.caption(note)


# ---------------------------------------------------------------- the mask and its live effect
# Three parts rerun separately: a head click reruns only the grid (edits pile up there), Apply
# reruns only the live effect (the grid is not sent or painted again), and the presets and layer
# boxes, which change the grid and the result at once, rerun the page.
@st.fragment
def head_grid():
    for i in range(L):
        name, row = st.columns([1, 14], vertical_alignment="center")
        name.caption(f"L{i}")
        row.pills(f"heads on in layer {i}", range(H), selection_mode="multi", key=row_key(i),
                  format_func=lambda h: f"h{h}", label_visibility="collapsed")
    grid = current_mask()
    ss[f"heads_saved:{mkey}"] = pruning.encode_mask(grid)
    # Apply does not rerun this part, so this line must stay true after it: a count, not a "pending" flag.
    st.caption(f"The grid above has {int(grid.sum())} heads on; the result below is for the mask applied last.")


@st.fragment
def live_part():
    keep = applied_mask()  # Apply's callback has run by now
    runs = live_runs(keep) if keep.any() else None  # before anything is drawn: see live_runs
    st.button("Apply", key="heads_apply", type="primary", on_click=apply_edits,
              help="show the effect of the mask above: every head edit since the last Apply, in one run")
    st.query_params["model"] = mkey
    if keep.all():
        st.query_params.pop("heads", None)
    else:
        st.query_params["heads"] = pruning.encode_mask(keep)
    n_on = int(keep.sum())
    st.caption(f"{n_on} of {L * H} heads on · the mask is yours alone and lives in this page's link")
    if n_on == 0:
        st.error("Every head is switched off: nothing is left to compare or prune. Turn at least one head "
                 "back on (or press Reset); importance and pruning curves below still work.")
        return
    st.subheader("Live effect", divider="gray")
    live_effect(keep, runs)


with st.expander("Head mask — click heads, then Apply; a layer box and the buttons above it act at once",
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
    only = p4.selectbox("layer", range(L), index=L - 1, key=f"heads_only:{shape}")
    p4.button("Keep this layer only", key="heads_only_btn",
              on_click=lambda: set_mask([[i == only] * H for i in range(L)]))
    st.caption("Whole layers, at once:")
    per_row = min(L, 10)
    boxes = st.columns(per_row)
    grid = current_mask()
    for i in range(L):
        ss[layer_key(i)] = bool(grid[i].all())
        boxes[i % per_row].checkbox(f"layer {i}", key=layer_key(i), on_change=layer_changed, args=(i,))
    # One multi-select row per layer, not one checkbox per head: 30 widgets instead of 270 for
    # SmolLM2, which halves what the grid costs to send and to paint.
    st.caption("Heads: highlighted = on. Click heads to switch them, then Apply.")
    head_grid()
live_part()
keep = applied_mask()       # the tools below work on the mask the results above are for
all_off = not keep.any()
imp_tab, curve_tab, prune_tab = st.tabs(["Importance", "Pruning curve", "Real pruning"])

# ---------------------------------------------------------------- evaluation text
@st.cache_resource(max_entries=16, show_spinner=False)
def eval_data(_model, key, text, tokens, window):
    """Tokenizing the bundled text costs tens of ms: once per model, text and sizes."""
    return importance.eval_windows(_model, text, tokens, window)


def eval_settings(tab, prefix):
    c1, c2, c3, c4 = tab.columns(4)
    source = c1.radio("evaluation text", ["bundled (Alice, ch. I–II)", "the text above"], key=f"{prefix}_src")
    tokens = c2.select_slider("tokens", [32, 64, 128, 256, 512, 1024, 2048], 128 if lm else 256,
                              key=f"{prefix}_tokens")
    window = c3.select_slider("window", [32, 64, 128, 256], 64, key=f"{prefix}_window")
    cap = max(1, int(LIMITS.max_importance_seconds))
    if ss.get(f"{prefix}_budget", 0) > cap:
        ss[f"{prefix}_budget"] = cap
    budget = c4.number_input("time budget (s)", 1, cap, min(120, cap), key=f"{prefix}_budget",
                             help=f"at most {cap} s on this server (ATTNVIZ_MAX_IMPORTANCE_SECONDS)")
    try:
        data = eval_data(model, mkey, None if source.startswith("bundled") else text, tokens, window)
    except ValueError as err:
        tab.warning(ui.plain(str(err)))
        return None, budget
    tab.caption(f"{data.n_windows} window(s) of {data.ids.shape[1]} tokens · {data.n_tokens} tokens used"
                f" of {data.available}")
    return data, budget


def run_tracked(tab, store, label, budget, fn) -> bool:
    """Run fn(progress, budget) with a progress bar, holding one of the server's heavy-job slots;
    every partial result is saved at once, so a Cancel click (which interrupts this run) loses
    nothing. False (with the reason shown) when the run could not start."""
    try:
        with jobs.heavy_job(label):
            ss[store + ":running"] = True
            cancel = tab.empty()
            cancel.button("Cancel", key=store + ":cancel")
            bar = tab.progress(0.0, text=label)

            def progress(done, total, partial):
                ss[store] = (partial, ss[store + ":budget"])
                bar.progress(done / max(total, 1), text=f"{label}: {done} / {total}")

            ss[store + ":budget"] = budget
            result = fn(progress, budget)
    except ValueError as err:  # the server is busy, or the budget is over its limit
        ss[store + ":running"] = False
        tab.error(ui.plain(str(err)))
        return False
    ss[store] = (result, budget)
    ss[store + ":running"] = False
    cancel.empty()
    bar.empty()
    return True


def partial_note(tab, store, what):
    if ss.get(store + ":running"):  # a run was interrupted by a click (Cancel or any widget)
        ss[store + ":running"] = False
        ss[store + ":stopped"] = "cancelled"
    if store in ss and not ss[store][0].complete:
        why = "was cancelled" if ss.get(store + ":stopped") == "cancelled" else \
            f"reached its time budget ({ss[store][1]} s)"
        tab.warning(f"The {what} run {why} after {ss[store][0].done} of {ss[store][0].total} steps: "
                    "the partial result is shown. Run again to finish.")


def csv_download(label, frame, file_name, key):
    """Every CSV of this page: spreadsheet-safe (exports.csv_text), made only when clicked."""
    st.download_button(label, lambda: exports.csv_text(frame), file_name, "text/csv", key=key)


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
    if st.button("Compute importance", key="heads_imp_go", disabled=data is None):
        ss[store + ":stopped"] = None
        keep = applied_mask()
        if under_mask and not keep.any():
            imp_tab.error("Every head is switched off: there is no mask to estimate under. Turn a head on or "
                          "untick “estimate under the current mask”.")
        elif run_tracked(imp_tab, store, f"{method} importance", budget,
                       lambda progress, seconds: importance.head_importance(
                           model, data, method, keep.float() if under_mask else None, progress=progress,
                           max_seconds=seconds)):
            st.rerun()  # the preset buttons above were drawn before this result existed
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
            csv_download("Importance CSV", table, f"head-importance-{mkey}.csv", "heads_imp_csv")

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
        run_tracked(curve_tab, cstore, "pruning curve", budget, lambda progress, seconds: pruning.pruning_curve(
            model, data_c, method=curve_method, seeds=tuple(range(int(seeds))), normalised=curve_norm,
            progress=progress, max_seconds=seconds))
    partial_note(curve_tab, cstore, "pruning-curve")
    if cstore in ss and len(ss[cstore][0].table):
        summary = ss[cstore][0].summary()
        for metric in (("perplexity", "top1") if lm else ("cosine",)):
            st.plotly_chart(heads_viz.curve_figure(summary, metric, log_y=metric == "perplexity"),
                            key=f"heads_curve_{metric}")
        st.dataframe(summary, hide_index=True, key="heads_curve_table")
        csv_download("Pruning curve CSV", ss[cstore][0].table, f"pruning-curve-{mkey}.csv", "heads_curve_csv")

with prune_tab:
    lengths = st.multiselect("sequence lengths", [16, 32, 64, 128, 256, 512, 1024], [32, 128, 512],
                             key="heads_lengths")
    repeats = st.number_input("runs per length (median and IQR)", pruning.MIN_REPEATS, 20, 5, key="heads_repeats",
                              help=f"after {pruning.WARMUP_RUNS} untimed warm-up runs of each model, the full "
                                   "and the pruned model run in turn this many times")
    st.caption("Prunes the heads that are on in the applied mask above into a new model; the shared model "
               "is not touched.")
    pstore = f"heads_speed:{mkey}"
    if st.button("Prune and measure", key="heads_prune_go", disabled=all_off or not lengths):
        keep = applied_mask()
        try:
            with jobs.heavy_job("prune and measure"), \
                    st.spinner("Building the pruned model, warming both up and timing them in turn…"):
                deadline = jobs.Deadline(LIMITS.max_importance_seconds)
                ss[pstore] = (pruning.encode_mask(keep), pruning.measure_speedup(
                    model, keep, lengths, int(repeats), should_stop=deadline.expired))
        except ValueError as err:
            st.error(ui.plain(str(err)))
    if pstore in ss:
        mask_code, sp = ss[pstore]
        if mask_code != pruning.encode_mask(applied_mask()):
            st.info("Measured for an earlier mask; press the button to measure this one.")
        if not sp.complete:
            st.warning(f"Timing stopped at this server's limit ({LIMITS.max_importance_seconds:g} s) after "
                       f"{len(sp.table)} length(s): drop the longest lengths or the runs per length.")
        c1, c2 = st.columns(2)
        c1.metric("parameters (pruned)", f"{sp.params_pruned / 1e6:.2f} M",
                  f"{(sp.params_pruned - sp.params_full) / 1e6:+.2f} M of {sp.params_full / 1e6:.2f} M")
        c2.metric("heads kept", f"{sp.heads_kept} / {sp.heads_total}")
        modelled = sp.modelled()
        st.plotly_chart(heads_viz.latency_figure(sp.table, modelled), key="heads_latency")
        st.dataframe(sp.table, hide_index=True, key="heads_speed_table")
        csv_download("Speed-up CSV", sp.table, f"pruning-speedup-{mkey}.csv", "heads_speed_csv")
        st.caption("Medians of the runs; *_q1 / *_q3: their first and third quartiles (the IQR); speedup: "
                   "median of the per-round ratios full / pruned. bound: the most pruning can give when "
                   "attention takes the measured share of the time (Amdahl, 1 / (1 − share × removed "
                   "fraction)); flops_speedup: the same from FLOP counts.")
        noisy = pruning.noisy_lengths(sp.table)
        if noisy:
            st.warning(f"Not settled at {', '.join(map(str, noisy))} tokens: the runs spread widely or the "
                       "speed-up exceeds its bound — timing noise on a busy machine. Raise the runs per "
                       "length or measure when the machine is quiet.")
        if modelled is None:
            st.info("The Raspberry Pi cost model (attnviz.costmodel) is not available in this build.")
        else:
            st.caption("Raspberry Pi 4 / 5, modelled by attnviz.costmodel (a roofline model, not measured):")
            st.dataframe(modelled, hide_index=True, key="heads_pi_table")
