"""The Heads page's tools below the mask, one at a time: importance, pruning curve, real pruning
(and the corpus tool, `attnviz.ui.heads_corpus`, which the page adds).

Each holds one of the server's heavy-job slots while it runs, stops at its time budget, and stops
between steps when its browser session goes away (`attnviz.ui.job_controls`).
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from attnviz.analysis import head_answers, importance, pruning
from attnviz.base import exports, jobs
from attnviz.base.limits import LIMITS
from attnviz.base.names import session_key
from attnviz.figures import attention_figures
from attnviz.figures import head_figures
from attnviz.latency import speedup
from attnviz.ui import common
from attnviz.ui import shared_view
from attnviz.ui import job_controls
from attnviz.ui.head_editor import metric_delta

PAGE = "heads"


def K(name: str) -> str:
    return session_key(PAGE, name)


TOOLS = ("Importance", "Pruning curve", "Real pruning")


@st.cache_resource(max_entries=16, show_spinner=False)
def eval_data(_model, key, text, tokens, window):
    """Tokenizing the bundled text costs tens of ms: once per model, text and sizes."""
    return importance.eval_windows(_model, text, tokens, window)


TOKEN_CHOICES = (32, 64, 128, 256, 512, 1024, 2048)


@st.cache_data(max_entries=32, show_spinner=False)
def text_tokens(key: str, text: str | None, _model) -> int:
    """How many content tokens the evaluation text has (at most the largest choice); 0 when it
    cannot be used (eval_data then says why)."""
    try:
        return importance.eval_windows(_model, text, max(TOKEN_CHOICES), 32).available
    except ValueError:
        return 0


def token_options(available: int) -> list[int]:
    """The slider's choices: never more tokens than the text has (nor than this server allows);
    a text between two choices ends on its own length."""
    top = min(available, int(LIMITS.max_importance_tokens)) if available else TOKEN_CHOICES[0]
    options = [t for t in TOKEN_CHOICES if t < top]
    return options + [top] if top not in options else options


def eval_settings(view, prefix, default_tokens=None):
    ss = st.session_state
    c1, c2, c3, c4 = st.columns(4)
    source = c1.radio("evaluation text", ["bundled (Alice, ch. I–II)", "the text above"], key=K(f"{prefix}_src"))
    options = token_options(text_tokens(view.mkey, None if source.startswith("bundled") else view.text, view.model))
    wanted = default_tokens or (128 if view.lm else 256)
    default = max([t for t in options if t <= wanted] or options[:1])
    if ss.get(K(f"{prefix}_tokens"), default) not in options:   # a shorter text: the nearest choice below
        ss[K(f"{prefix}_tokens")] = max([t for t in options if t <= ss[K(f"{prefix}_tokens")]] or options[:1])
    if len(options) == 1:   # a slider needs two choices
        tokens = options[0]
        c2.caption(f"tokens: {tokens}, all the text has")
    else:
        tokens = c2.select_slider("tokens", options, default, key=K(f"{prefix}_tokens"),
                                  help=f"at most the {options[-1]:,} tokens the evaluation text has")
    window = c3.select_slider("window", [32, 64, 128, 256], 64, key=K(f"{prefix}_window"))
    cap = max(1, int(LIMITS.max_importance_seconds))
    if ss.get(K(f"{prefix}_budget"), 0) > cap:
        ss[K(f"{prefix}_budget")] = cap
    budget = c4.number_input("time budget (s)", 1, cap, min(120, cap), key=K(f"{prefix}_budget"),
                             help=f"at most {cap} s on this server (ATTNVIZ_MAX_IMPORTANCE_SECONDS)")
    try:
        data = eval_data(view.model, view.mkey, None if source.startswith("bundled") else view.text, tokens, window)
    except ValueError as err:
        st.warning(common.plain(str(err)[:300]))
        return None, budget
    st.caption(f"{data.n_windows} window(s) of {data.ids.shape[1]} tokens · {data.n_tokens} tokens used"
               f" of {data.available}")
    return data, budget


def run_tracked(store, label, budget, fn) -> bool:
    """Run fn(progress, budget, should_stop) with a progress bar, holding one of the server's heavy-job slots;
    every partial result is saved at once, so a Cancel click (which interrupts this run) loses
    nothing. False (with the reason shown) when the run could not start."""
    ss = st.session_state
    try:
        with job_controls.heavy_job(label) as cancel:
            ss[store + ":running"] = True
            cancel_slot = st.empty()
            cancel_slot.button("Cancel", key=store + ":cancel")
            bar = st.progress(0.0, text=label)

            def progress(done, total, partial):
                ss[store] = (partial, ss[store + ":budget"])
                bar.progress(done / max(total, 1), text=f"{label}: {done} / {total}")

            ss[store + ":budget"] = budget
            result = fn(progress, budget, cancel)
    except ValueError as err:  # the server is busy, or the budget is over its limit
        ss[store + ":running"] = False
        st.error(common.plain(str(err)))
        return False
    ss[store], ss[store + ":running"] = (result, budget), False
    cancel_slot.empty()
    bar.empty()
    return True


def partial_note(store, what):
    ss = st.session_state
    if ss.get(store + ":running"):  # a run was interrupted by a click (Cancel or any widget)
        ss[store + ":running"], ss[store + ":stopped"] = False, "cancelled"
    if store in ss and not ss[store][0].complete:
        fault = getattr(ss[store][0], "extra", {}).get("stopped_note")   # the cluster ended it (corpus runs)
        why = f"stopped ({common.plain(fault)})" if fault else "was cancelled" \
            if ss.get(store + ":stopped") == "cancelled" else f"reached its time budget ({ss[store][1]} s)"
        st.warning(f"The {what} run {why} after {ss[store][0].done} of {ss[store][0].total} steps: "
                   "the partial result is shown. Run again to finish.")


def csv_download(label, frame, file_name, key):
    """Every CSV of this page: spreadsheet-safe (exports.csv_text), made only when clicked."""
    st.download_button(label, lambda: exports.csv_text(frame), file_name, "text/csv", key=key)


def importance_tool(view, keep):
    ss = st.session_state
    data, budget = eval_settings(view, "imp")
    m1, m2, m3 = st.columns(3)
    normalised = m3.toggle("normalise per layer (Michel et al.)", True, key=K("imp_norm"),
                           help="on: each layer's scores divided by their L2 norm (the paper's choice); "
                                "off: raw scores, comparable across layers")
    method = m1.radio("method", ["gradient", "ablation"], key=K("imp_method"), horizontal=True,
                      help="gradient: Michel et al. (2019), |dL/dmask| normalised per layer; ablation: the "
                           "metric change when that head alone is removed (one pass per head)")
    under_mask = m2.checkbox("estimate under the current mask", key=K("imp_under"))
    store = K(f"imp:{view.mkey}")
    if st.button("Compute importance", key=K("imp_go"), disabled=data is None):
        ss[store + ":stopped"] = None
        means = view.means()  # before the job's slot is taken: the means hold one of their own
        if under_mask and not keep.any():
            st.error("Every head is switched off: there is no mask to estimate under. Turn a head on or "
                     "untick “estimate under the current mask”.")
        elif run_tracked(store, f"{method} importance", budget,
                         lambda progress, seconds, cancel: importance.head_importance(
                             view.model, data, method, keep.float() if under_mask else None,
                             progress=progress, max_seconds=seconds, should_stop=cancel,
                             ablation=view.ablation, means=means)):
            st.rerun()  # the editor above was drawn before this result existed: it colours by it
    partial_note(store, "importance")
    if store in ss:
        imp = ss[store][0]
        st.caption(f"{imp.method}, heads off by {imp.ablation} ablation: {imp.objective}" + ("" if view.lm or imp.method == "ablation" else
                   ". An encoder's loss 1 − cos sits at its minimum with every head on, where its gradient is "
                   "zero, so the score adds the Gauss-Newton curvature (exact Hessian there)."))
        table = imp.table(normalised)
        if len(table):
            figure = attention_figures.stat_map_figure(table, "score" if normalised else "raw")
            figure.update_layout(title=f"{imp.method} importance, {imp.ablation} ablation")
            st.plotly_chart(head_figures.mark_off_heads(figure, keep), key=K("imp_map"))
            if not keep.all():
                st.caption("× marks the heads that are off in the applied mask.")
            st.dataframe(table, hide_index=True, key=K("imp_table"))
            csv_download("Importance CSV", table, f"head-importance-{view.mkey}.csv", K("imp_csv"))


def curve_tool(view, keep):
    ss = st.session_state
    # a curve costs ~10 importance passes and 10 per random order: on a language model its
    # defaults stay small enough to finish, random baseline included, within the default budget
    data, budget = eval_settings(view, "curve", default_tokens=64 if view.lm else None)
    s1, s2, s3 = st.columns(3)
    seeds = s1.number_input("random orders (seeds)", 1, 10, 3, key=K("curve_seeds"))
    method = s2.radio("importance", ["gradient", "ablation"], key=K("curve_method"), horizontal=True,
                      help="re-estimated after every 10% step; ablation costs one pass per head")
    norm = s3.toggle("normalise per layer (Michel et al.)", True, key=K("curve_norm"))
    store = K(f"curve:{view.mkey}")
    if st.button("Compute pruning curve", key=K("curve_go"), disabled=data is None):
        ss[store + ":stopped"] = None
        means = view.means()
        run_tracked(store, "pruning curve", budget, lambda progress, seconds, cancel: pruning.pruning_curve(
            view.model, data, method=method, seeds=tuple(range(int(seeds))), normalised=norm,
            progress=progress, max_seconds=seconds, should_stop=cancel, ablation=view.ablation, means=means))
    partial_note(store, "pruning-curve")
    if store in ss and len(ss[store][0].table):
        summary = ss[store][0].summary()
        for metric in (("top1", "perplexity") if view.lm else ("cosine",)):
            said = head_answers.curve_sentence(summary, metric, view.L * view.H)
            if said:
                st.info(said)   # our numbers only
        for metric in (("perplexity", "top1") if view.lm else ("cosine",)):
            figure = head_figures.curve_figure(summary, metric, log_y=metric == "perplexity")
            figure.update_layout(title=f"{metric}: heads removed by {ss[store][0].ablation} ablation",
                                 margin=dict(t=60))
            st.plotly_chart(figure, key=K(f"curve_{metric}"))
        st.dataframe(summary, hide_index=True, key=K("curve_table"))
        csv_download("Pruning curve CSV", ss[store][0].table, f"pruning-curve-{view.mkey}.csv", K("curve_csv"))


def remeasure(sp, measure, should_stop=lambda: False):
    """(the speed-up with each noisy length's row replaced by a second measurement, the lengths
    measured again). `measure(lengths)` is `speedup.measure_speedup` for this model and mask."""
    noisy = speedup.noisy_lengths(sp.table)
    if not noisy or should_stop():
        return sp, []
    second = measure(noisy).table
    done = [int(n) for n in second["tokens"]]
    kept = sp.table[~sp.table["tokens"].isin(done)]
    sp.table = pd.concat([kept, second]).sort_values("tokens", ignore_index=True)
    return sp, done


def measure_tracked(view, keep, lengths, repeats: int, store: str):
    """Prune and measure with a progress bar and Cancel (a click interrupts the run), holding a
    heavy-job slot; each result is saved at once, then the noisy lengths are measured once more."""
    ss = st.session_state
    code = pruning.encode_mask(keep)
    try:
        with job_controls.heavy_job("prune and measure") as cancel:
            ss[store + ":running"] = True
            cancel_slot = st.empty()
            cancel_slot.button("Cancel", key=K("prune_cancel"))
            bar = st.progress(0.0, text="Building the pruned model and warming both up…")
            deadline = jobs.Deadline(LIMITS.max_importance_seconds)
            stop = lambda: deadline.expired() or cancel.is_set()

            def progress(what):
                return lambda done, total, n: bar.progress(
                    done / max(total, 1), text=f"{what}: round {done} of {total} (at {n} tokens)")

            sp = speedup.measure_speedup(view.model, keep, lengths, repeats, should_stop=stop,
                                         progress=progress("Timing full and pruned in turn"))
            ss[store] = (code, sp, [])
            ss[store] = (code, *remeasure(sp, lambda again: speedup.measure_speedup(
                view.model, keep, again, repeats, should_stop=stop,
                progress=progress("Measuring the unsettled lengths again")), stop))
    except ValueError as err:
        st.error(common.plain(str(err)))
        ss[store + ":running"] = False
        return
    ss[store + ":running"] = False
    cancel_slot.empty()
    bar.empty()


def prune_tool(view, keep):
    ss = st.session_state
    lengths = st.multiselect("sequence lengths", [16, 32, 64, 128, 256, 512, 1024], [32, 128, 512],
                             key=K("lengths"))
    repeats = st.number_input("runs per length (median and IQR)", speedup.MIN_REPEATS, 20, 5, key=K("repeats"),
                              help=f"after {speedup.WARMUP_RUNS} untimed warm-up runs of each model, the full "
                                   "and the pruned model run in turn this many times")
    st.caption("Prunes the heads that are on in the applied mask above into a new model; the shared model "
               "is not touched.")
    store = K(f"speed:{view.mkey}")
    if st.button("Prune and measure", key=K("prune_go"), disabled=not keep.any() or not lengths):
        measure_tracked(view, keep, lengths, int(repeats), store)
    if ss.get(store + ":running"):  # a click (Cancel or any widget) interrupted the run
        ss[store + ":running"] = False
        st.warning("Prune and measure was cancelled" + (": the last finished measurement is shown."
                                                         if store in ss else "."))
    if store not in ss:
        return
    mask_code, sp, again = ss[store]
    if mask_code != pruning.encode_mask(keep):
        st.info("Measured for an earlier mask; press the button to measure this one.")
    if not sp.complete:
        st.warning(f"Timing stopped at this server's limit ({LIMITS.max_importance_seconds:g} s) after "
                   f"{len(sp.table)} length(s): drop the longest lengths or the runs per length.")
    c1, c2 = st.columns(2)
    removed = (sp.params_pruned - sp.params_full) / 1e6
    c1.metric("parameters (pruned)", f"{sp.params_pruned / 1e6:.2f} M", **metric_delta(
        removed, f"{removed:+.2f} M of {sp.params_full / 1e6:.2f} M", "lower"))
    c2.metric("heads kept", f"{sp.heads_kept} / {sp.heads_total}")
    modelled = sp.modelled()
    st.plotly_chart(head_figures.latency_figure(sp.table, modelled), key=K("latency"))
    st.dataframe(sp.table, hide_index=True, key=K("speed_table"), column_config=common.ms_columns(sp.table.columns))
    csv_download("Speed-up CSV", sp.table, f"pruning-speedup-{view.mkey}.csv", K("speed_csv"))
    st.caption("Medians of the runs; *_q1 / *_q3: their first and third quartiles (the IQR); speedup: "
               "median of the per-round ratios full / pruned. bound: the most pruning can give when "
               "attention takes the measured share of the time (Amdahl, 1 / (1 − share × removed "
               "fraction)); flops_speedup: the same from FLOP counts.")
    noisy = speedup.noisy_lengths(sp.table)
    if again:
        st.caption(f"Measured again (their first runs were not settled): {', '.join(map(str, again))} tokens.")
    if noisy:
        st.warning(f"Not settled at {', '.join(map(str, noisy))} tokens" + (" even when measured again" if
                   set(noisy) & set(again) else "") + ": the runs spread by more than half their median, "
                   "or the speed-up exceeds its bound — timing noise on a busy machine. Raise the runs per "
                   "length or measure when the machine is quiet.")
    st.caption("Raspberry Pi 4 / 5, modelled by attnviz.latency.costmodel (a roofline model, not measured):")
    st.dataframe(modelled, hide_index=True, key=K("pi_table"),
                 column_config=common.ms_columns(modelled.columns) if modelled is not None else None)


def tools(view, keep, more=None):
    """One tool at a time: the choice is remembered across buttons and downloads, and only the
    chosen tool's widgets and work run. `more`: further tools, name -> tool(view, keep)."""
    chosen = {"Importance": importance_tool, "Pruning curve": curve_tool, "Real pruning": prune_tool, **(more or {})}
    choice = st.segmented_control("tool", default=TOOLS[0], required=True, **shared_view.linked(K("tool"), options=list(chosen)),
                                  label_visibility="collapsed")
    chosen[choice](view, keep)
