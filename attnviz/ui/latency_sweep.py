"""The Latency page: what attention costs as sequences grow, measured on this CPU and modelled for
a Raspberry Pi; a CSV from a real Pi overlays measured on modelled.

Widgets, session state, caches and the heavy jobs live here; the work is in `attnviz.latency`
(sweeps, cost model, calibration, analyses) and the figures in `attnviz.figures.latency_figures`. Only
the chosen results view computes (`common.view_choice`): the cost-model views calibrate this CPU
and model every point, which no rerun of another view should pay for.
"""
from __future__ import annotations

import os

import pandas as pd
import streamlit as st

from attnviz.base import jobs
from attnviz.base.limits import LIMITS
from attnviz.base.names import session_key
from attnviz.figures import latency_figures
from attnviz.latency import calibrate, compare, decode, engines, measure, pi_memory, quantize, results, sweep, tradeoff
from attnviz.latency import costmodel, int8_story, latency_answers, pacing
from attnviz.ui import common, latency_crossover
from attnviz.ui import job_controls
from attnviz.ui import shared_view
from attnviz.weights.catalogue import BUNDLED

PAGE = "latency"
VARIANTS = ["fused", "eager", "chunked:128", "local:64", "linear", "relu"]
VIEWS = ["Latency", "Split and fit", "Memory", "Tokens/s", "Decode", "Comparisons", "Model error"]
PROFILES, RESULTS, STOPPED = (session_key(PAGE, k) for k in ("profiles", "results", "stopped"))
DECODE_SHARE = 0.7  # of the time budget for the forward sweep when decode depths are asked for
# the table: what tells two rows apart first (a device, engine and dtype), then the numbers
TABLE = ["backend", "engine", "dtype", "measured", "model", "variant", "seq_len", "n_heads", "threads", "median_ms",
         "p10_ms", "p90_ms", "peak_mem_mb", "tokens_per_s"]


# milliseconds to three significant figures; what peak_mem_mb counts, said where it is read
TABLE_COLUMNS = {**common.ms_columns(("median_ms", "p10_ms", "p90_ms")),
                 "peak_mem_mb": st.column_config.NumberColumn(
                     "peak_mem_mb (activations)", format="%.3g", help="peak of the activations and workspace of one "
                     "forward pass, in MB: the model's weights are not counted (they are the same at every length)"),
                 "tokens_per_s": st.column_config.NumberColumn("tokens_per_s", format="%.3g")}


def K(name: str) -> str:
    return session_key(PAGE, name)


def intro():
    common.sidebar_nav()  # this page has no model picker, which draws it on the others
    st.caption("One forward pass, batch 1, float32. **cpu** is measured here; **pi4** / **pi5** come from a "
               "cost model built on published Raspberry Pi figures; a CSV from `python -m attnviz.bench` run on "
               "a real Pi can be imported below.")
    st.session_state.setdefault(PROFILES, {})  # Pi profiles recalibrated from an imported CSV


@st.cache_resource(max_entries=8, show_spinner=False)
def synthetic(spec: str):
    return measure.load(spec)


def get_model(key: str):
    return synthetic(key) if key.startswith("synthetic:") else common.shared_model(key)


def host(threads: int, clock: str):
    """This CPU's calibrated profile at a thread count (a separate process for other counts), or None
    after showing why not."""
    try:
        return calibrate.host_profile(int(threads), clock)
    except ValueError as err:
        st.error(common.plain(str(err)))
        return None


# ---------------------------------------------------------------- the sweep
def sweep_form():
    """The form; on Run, the sweep (or a message saying why not, the results on screen staying)."""
    here = measure.threads_now()  # this server's torch threads: other counts run in a separate process
    with st.form(K("form"), enter_to_submit=False):  # Enter in a box must not start a run
        c1, c2, c3 = st.columns(3)
        one_pass = [k for k, s in BUNDLED.items() if s["task"] not in ("translation", "speech")]
        picked = c1.multiselect("Models", default=["minilm"],
                                **shared_view.linked(K("models"), options=one_pass, kind=list))  # translators and Whisper: their own sections below
        specs = c1.text_area("Synthetic shapes (one per line)", key=K("synthetic"), height=68,
                             placeholder="synthetic:layers=6,d=384,heads=8",
                             help="Random weights, for timing: layers, d, heads; optional kv, dh, ff, vocab, "
                                  "positions, causal=1, family")
        form = dict(models=picked + [s.strip() for s in specs.splitlines() if s.strip()])
        form["variants"] = c2.multiselect("Attention variants", default=["fused"],
                                          **shared_view.linked(K("variants"), options=VARIANTS, kind=list))
        form["seq"] = c2.text_input("Sequence lengths", "16,32,64,128,256", **shared_view.linked(K("seq"), 200))
        form["heads"] = c2.text_input("Heads kept per layer", "all", **shared_view.linked(K("heads"), 200),
                                      help="'all', or counts such as 4,8: the first k heads of every layer, pruned")
        form["threads"] = c2.multiselect(
            "Threads", sorted(set(range(1, (os.cpu_count() or 1) + 1)) | {here}), default=[here], key=K("threads"),
            help=f"this server runs on {here}; other thread counts are measured in a separate process (torch's "
                 "thread count is shared by every session here)")
        form["backends"] = c3.multiselect("Backends", default=["cpu", "pi4", "pi5"],
                                          **shared_view.linked(K("backends"), options=["cpu", "pi4", "pi5"], kind=list))
        form["pi_threads"] = c3.multiselect(
            "Pi threads", list(range(1, sweep.PI_CORES + 1)), default=[sweep.PI_CORES], key=K("pi_threads"),
            help=f"the modelled Pi rows run at these threads whatever this server has (a Pi has {sweep.PI_CORES} cores)")
        form["engines"] = c3.multiselect("Pi engines", list(engines.ENGINES), default=["torch"], key=K("engines"),
                                         help="; ".join(f"{e}: {w}" for e, w in engines.ENGINES.items()))
        form["dtypes"] = c3.multiselect("Dtypes", list(engines.DTYPES), default=["fp32"], key=K("dtypes"),
                                        help=f"cpu rows: measured in each of {', '.join(sweep.MEASURED_DTYPES)} chosen "
                                             "(torch's int8, a bf16 copy); Pi rows: each engine at the dtypes it runs: " + "; ".join(
                                            f"{e} {', '.join(d)}" for e, d in engines.ENGINE_DTYPES.items()))
        form["repeats"] = c3.number_input("Repeats", 1, 50, 3, key=K("repeats"))
        form["warmup"] = c3.number_input("Warm-up runs", 0, 10, 1, key=K("warmup"))
        form["clock"] = c3.radio("Clock", horizontal=True, **shared_view.linked(K("clock"), options=["wall", "cpu"]),
                                 help="cpu: this process's CPU time; ignores other programs on a busy machine "
                                      "(1 thread)")
        form["memory"] = c3.checkbox("Measure peak memory", True, key=K("memory"))
        form["crossover"] = c3.checkbox("One block to the crossover", True, key=K("crossover"))  # latency.crossover
        form["decode"] = c2.text_input("Decode depths (causal LMs)", "", key=K("decode"), placeholder="0,128,512",
                                       help="llama-bench's pp (a 128-token prompt) and tg (one token at each KV-cache "
                                            "depth), measured here and modelled on the Pi backends")
        b1, b2 = st.columns(2)
        cap_s, cap_mb = int(LIMITS.max_sweep_seconds), int(min(measure.memory_budget_mb(), LIMITS.max_sweep_memory_mb))
        form["max_s"] = b1.number_input("Time budget (s)", 1, cap_s, min(120, cap_s), key=K("budget_s"),
                                        help=f"at most {cap_s} s on this server (ATTNVIZ_MAX_SWEEP_SECONDS)")
        form["max_mb"] = b2.number_input("Memory budget (MB)", 100, max(100, cap_mb), max(100, cap_mb),
                                         key=K("budget_mb"),
                                         help="at most half the free memory, and ATTNVIZ_MAX_SWEEP_MEMORY_MB")
        run = st.form_submit_button("Run", type="primary")
    if run:
        try:
            swept = run_form(form, here)
        except ValueError as err:  # bad input, over budget, server busy: what was on screen stays
            st.error(common.plain(str(err)))
        else:
            st.session_state[RESULTS], st.session_state[STOPPED] = swept, swept.attrs.get("stopped", "")


def run_form(form: dict, here: int):
    """The form's sweep, or a ValueError before any work when it is bad, over budget or the server
    is busy. It stops at the time budget, keeping what it measured (`attrs["stopped"]` says so)."""
    heads = form["heads"].strip().lower()
    plan = sweep.SweepPlan(
        models=form["models"], seq_lens=sweep.parse_int_list(form["seq"], "Sequence lengths"),
        variants=form["variants"], heads=None if heads == "all" else sweep.parse_int_list(heads, "Heads"),
        threads=[int(t) for t in form["threads"]], backends=form["backends"], repeats=int(form["repeats"]),
        warmup=int(form["warmup"]), memory=form["memory"], clock=form["clock"],
        engines=list(form.get("engines") or ["torch"]), dtypes=list(form.get("dtypes") or ["fp32"]),
        pi_threads=[int(t) for t in form.get("pi_threads") or [sweep.PI_CORES]],
        crossover=bool(form.get("crossover", True))).check()
    max_s, max_mb = form["max_s"], form["max_mb"]
    decoding = bool((form.get("decode") or "").strip())
    # from the press of Run: loading and calibrating count too. Decode depths get a share of the
    # budget of their own, else the forward sweep spends it all and no decode row is measured.
    deadline = jobs.Deadline(max_s, "the sweep")
    forward = jobs.Deadline(max_s * (DECODE_SHARE if decoding else 1.0), "the forward-pass sweep" if decoding else
                            "the sweep")
    configs = sweep.configs_of(plan.models, loader=get_model)  # synthetic shapes: parsed, not built
    sweep.estimate(plan, configs, costmodel.HOST_GUESS).check(None, max_mb)  # memory does not need a calibration
    with job_controls.heavy_job("a latency sweep") as cancel:
        with st.spinner("Calibrating this CPU…"):
            here_profile = calibrate.host_profile(here, plan.clock)
        est = sweep.estimate(plan, configs, here_profile)
        est.check(max_s, max_mb)
        models = pi_memory.models_for(plan, configs, get_model)  # modelled rows only: no model is built
        with st.spinner("Timing the sweep's first point on this machine…"):
            # the smallest point, cancellable; its time counts against the budget (from the press of Run)
            first = pacing.first_point_estimate(plan, models, here_profile, check=cancel.check)
        # the cost model alone can be several times off on a busy host: a point timed here is not
        ahead = deadline.elapsed + (first.seconds if first else est.seconds)
        said = (f"about {ahead:,.1f} s in all (its first point, {first.label}, took {first.point_s:.2f} s here; the "
                "others scaled from it by the cost model)" if first else f"about {ahead:,.1f} s (the cost model's guess)")
        bar = st.progress(0.0, text=f"{est.points} points; {said}; stops at {max_s} s")
        df = sweep.run_sweep(plan, models, profiles=st.session_state[PROFILES],
                             deadline=forward, cancel=cancel, progress=lambda i, n, label: bar.progress(
                                 min(i / max(n, 1), 1.0), text=common.plain(label) + f" · estimated at the start: "
                                                                               f"about {ahead:,.0f} s in all"))
        bar.empty()
        if decoding:
            with st.spinner("Decode latency…"):
                depths = [int(x) for x in form["decode"].replace(" ", "").split(",") if x.isdigit()]
                dec = decode.decode_sweep(plan, models, depths or [0],
                                          profiles=st.session_state[PROFILES], deadline=deadline)
            attrs = dict(df.attrs)
            df = pd.concat([df, dec], ignore_index=True).reindex(columns=df.columns)
            df.attrs = dict(attrs, stopped="; ".join(m for m in (attrs.get("stopped"), dec.attrs["stopped"]) if m))
        df.attrs["pi_memory"] = [note for fits, note in pi_memory.ram_notes(plan, configs) if not fits]
        with st.spinner("Calibrating this CPU at the sweep's thread counts…"):
            for t in sorted(set(plan.threads) - {here}):  # the cost-model views need them: here, in the slot
                if deadline.expired():
                    break  # the views calibrate when they are opened
                try:
                    calibrate.host_profile(t, plan.clock)
                except ValueError:
                    break  # the views say why
    df.attrs["took"] = (deadline.elapsed, max_s)
    df.attrs["estimate"] = "Estimated before it ran: " + said + f"; it took {deadline.elapsed:,.1f} s" + (
        " (decode depths and other thread counts are not in the estimate)." if decoding or set(plan.threads) - {here}
        else ".")
    return df


# ---------------------------------------------------------------- results: one view at a time
def results_views():
    df = st.session_state.get(RESULTS)
    if df is not None and st.session_state.get(STOPPED):
        st.warning(common.plain(st.session_state[STOPPED]) + (" Nothing was measured: raise the time budget or "
                                                              "choose a smaller sweep." if df.empty else ""))
    if df is None or df.empty:
        st.info("Choose models, variants and sequence lengths, then press Run.")
        return
    if "took" in df.attrs:
        st.caption("The sweep took {:,.0f} s of its {:,.0f} s budget.".format(*df.attrs["took"]))
    if "estimate" in df.attrs:
        st.caption(common.plain(df.attrs["estimate"]))
    for note in df.attrs.get("pi_memory", ()):  # modelled Pi rows of a model the board could not hold
        st.warning(common.plain(note))
    said = latency_answers.sweep_sentence(df[df["test"].isna() | (df["test"] == "")] if "test" in df.columns else df,
                                   quote=common.plain)
    if said:
        st.info(said)
    st.dataframe(df[TABLE], hide_index=True, key=K("table"), column_config=TABLE_COLUMNS)
    # results.to_csv is exports.csv_text: text cells that a spreadsheet would run as formulas are neutralised
    st.download_button("Download CSV", results.to_csv(df), "attnviz-latency.csv", "text/csv", key=K("download"),
                       on_click="ignore")
    chosen = common.view_choice(PAGE, VIEWS)
    if chosen == "Decode":
        return decode_view(df)
    df = df[df["test"].isna() | (df["test"] == "")] if "test" in df.columns else df  # one forward pass per row
    if df.empty:
        st.info("These results hold decode rows only: choose the Decode view.")
        return
    {"Latency": latency_view, "Split and fit": split_and_fit, "Memory": memory_view, "Comparisons": comparisons_view,
     "Tokens/s": lambda d: st.plotly_chart(latency_figures.throughput_figure(d), key=K("fig_tps")),
     "Model error": model_error_view}[chosen](df)


def latency_view(df):
    st.plotly_chart(latency_figures.latency_figure(df), key=K("fig_linear"))
    if df["seq_len"].nunique() > 1:
        st.plotly_chart(latency_figures.growth_figure(df), key=K("fig_log"))
    else:
        st.caption("One sequence length: add more (e.g. 16,32,64,128,256) to see how the time grows with n.")
    latency_crossover.crossover_view(st.session_state.get(RESULTS))  # one block: test "block" rows


def decode_view(df):
    if "test" not in df.columns or not (df["test"] == "tg").any():
        st.info("Give decode depths (e.g. 0,128,512) and a causal model (SmolLM2), then press Run.")
        return
    st.plotly_chart(latency_figures.decode_figure(df), key=K("fig_decode"))
    st.dataframe(latency_figures.decode_table(df), hide_index=True, key=K("decode_table"))
    st.caption("llama-bench's meaning: pp = prompt tokens / s of one pass over the prompt; tg = generated tokens "
               "/ s, one token at a time, reading the KV cache of `depth` earlier tokens (-d).")


def memory_view(df):
    st.plotly_chart(latency_figures.memory_figure(df), key=K("fig_memory"))
    for same in latency_figures.same_devices(df):
        st.caption(f"{same}: the memory model does not depend on the device (the activations are the same "
                   "tensors on any CPU), so their curves are one line.")


def split_and_fit(df):
    """Where the time goes (cost model) on a device, and the quadratic fit of a series."""
    c1, c2, c3 = st.columns(3)
    key = c1.selectbox("Model", sorted(df["model"].unique()), key=K("split_model"))
    variant = c2.selectbox("Variant", sorted(df["variant"].unique()), key=K("split_variant"))
    names = {"cpu (this host)": None, **{b: b for b in ("pi4", "pi5")}}
    where = c3.selectbox("Device", list(names), key=K("split_device"))
    sel = df[(df["model"] == key) & (df["variant"] == variant)]
    sel = sel[sel["n_heads"] == sel["n_heads"].max()]
    cfg, b, run_clock = results.row_config(sel.iloc[0]), names[where], str(df["clock"].iloc[0])
    prof = host(sel["threads"].min(), run_clock) if b is None else st.session_state[PROFILES].get(b, costmodel.PROFILES[b])
    if prof is None:
        return
    ns = sorted(sel["seq_len"].unique())
    split = compare.split_table(cfg, ns, prof, variant)
    st.plotly_chart(latency_figures.split_figure(split, f"Where the time goes on {where} (cost model)"), key=K("fig_split"))
    pts = sel[sel["backend"] == ("cpu" if b is None else b)]
    pts = pts[pts["threads"] == pts["threads"].min()]
    if pts.empty:  # that device was not in the sweep: fit the model's own curve
        pts = split.assign(median_ms=split.drop(columns="seq_len").sum(axis=1), measured=False)
    cross = costmodel.attention_crossover(cfg, prof, variant)
    att = compare.attention_only(cfg, ns, prof, "eager" if variant == "fused" else variant, model=key)
    st.plotly_chart(latency_figures.growth_figure(att, title=f"One layer's attention alone on {where} (QKᵀ, softmax, ·V; "
                                                "cost model)"), key=K("fig_attention_only"))
    if pts["seq_len"].nunique() >= 3:
        st.plotly_chart(latency_figures.fit_figure(pts["seq_len"], pts["median_ms"], f"{key} · {where}", cross,
                                    measured=bool(pts["measured"].all())), key=K("fig_fit"))
    else:
        st.info("The quadratic fit needs at least three sequence lengths.")
    st.caption(f"Attention takes half the time from n ≈ {cross:,} on {where}." if cross else
               f"With {variant}, attention never takes half the time on {where} (up to 65,536 tokens).")
    st.caption(f"Pruning half the heads can speed {common.plain(key)} up by at most "
               f"{costmodel.speedup_bound(cfg, ns[-1], 0.5, prof, variant):.2f}× at n = {ns[-1]} (only the per-head "
               "work shrinks: attention and the Q/K/V/output projections; the MLP stays).")


def comparisons_view(df):
    cmp = compare.seed_claims(df)
    if cmp.empty:
        st.info("Comparisons need n and n/2, several head counts, or fused beside another variant.")
        return
    st.plotly_chart(latency_figures.comparison_figure(cmp), key=K("fig_compare"))
    st.dataframe(cmp, hide_index=True, key=K("compare_table"))


def model_error_view(df):
    if not df["measured"].any():
        st.info("Include the cpu backend to compare this host's measurements with its cost model.")
        return
    try:
        err = compare.host_model_error(df)
    except ValueError as problem:  # calibrating at another thread count failed
        st.error(common.plain(str(problem)))
        return
    st.metric("Largest cost-model error here", f"{err['error_pct'].abs().max():.1f} %")
    st.plotly_chart(latency_figures.error_figure(err), key=K("fig_error"))
    st.caption("On a busy machine choose the cpu clock with one thread: wall time then includes other "
               "programs, which no cost model can predict.")


# ---------------------------------------------------------------- edge questions: quantization, heads
QUANT_MODELS = ("minilm", "smollm2", "dinov2", "en-pt", "pt-en")


@st.cache_data(max_entries=8, show_spinner=False)
def quantization_tables(keys: tuple[str, ...], rounds: int):
    with job_controls.heavy_job("quantization") as cancel:  # a closed tab stops it between copies
        return (int8_story.int8_table(keys, loader=common.shared_model, rounds=rounds, check=cancel.check),
                quantize.probabilities_int8(common.shared_model("minilm")))


@st.cache_data(max_entries=1, show_spinner=False)
def heads_table():
    return tradeoff.heads_table()  # evaluates the toys once per process, not on every rerun


def edge_views():
    """int8 / bf16 measured here, the seed's 8-bit softmax-vs-ReLU experiment, and 4 vs 8 heads on the Pi."""
    st.subheader("Quantization and heads on the Pi")
    if st.button("4 vs 8 heads at equal d_model on a Pi 4 and Pi 5 (4 threads, cost model)", key=K("heads_tradeoff")):
        st.session_state[K("heads_shown")] = True
    if st.session_state.get(K("heads_shown")):  # computed once asked for, not on every page open
        table = heads_table()
        said = latency_answers.heads_tradeoff_sentence(table)
        if said:
            st.info(said)   # built from our own numbers and names: no user text to escape
        st.dataframe(table.fillna(""), hide_index=True, key=K("heads_table"), column_config={
            c: st.column_config.NumberColumn(c, format="%.3g") for c in table.columns if c.endswith(" ms")})
        st.caption("The Lab's recall toys (d_model 64) and a MiniLM-sized shape; the toys' exact accuracy on their "
                   "held-out set is beside them (blank for a shape: it has no task).")
    int8_section()


def int8_section():
    """int8 in one table per model: modelled on each Pi, measured here, and its fidelity."""
    st.markdown("**int8: modelled on the Pi, measured here, and what it keeps**")
    keys = st.multiselect("Models", list(QUANT_MODELS), default=["minilm"], key=K("quant_models"),
                          help="each is loaded (SmolLM2: about 45 s the first time), copied to int8 (and bf16 where "
                               "this CPU has it) and timed against float32 here")
    st.caption("Computed only when you press the button (it loads, quantizes and times each model: tens of seconds "
               "a model); the Pi columns are the cost model's, the rest is measured on this CPU.")
    if st.button("Measure int8 of these models here", key=K("quantize"), disabled=not keys):
        try:
            with st.spinner(f"Quantizing and timing {len(keys)} model(s)…"):
                st.session_state[K("quantized")] = quantization_tables(tuple(keys), 3)
        except ValueError as err:  # the server is busy, or the tab that asked has gone
            st.error(common.plain(str(err)))
    if K("quantized") in st.session_state:
        table, probs = st.session_state[K("quantized")]
        for _, row in table.iterrows():
            st.info(int8_story.int8_sentence(row))   # bundled keys and our numbers: nothing to escape
        st.dataframe(table, hide_index=True, key=K("quant_table"))
        st.caption("Speed-up: float32 time / int8 time (above 1× is faster). Pi: the cost model at "
                   f"{int8_story.TOKENS} tokens and 4 threads, torch int8 against torch fp32, with its ±25 % band; "
                   "this CPU: torch's dynamic int8 of the linear layers (bf16: a bf16 copy), timed in turn with "
                   "float32. Blank: the Pi cost model does not price that kind of model here.")
        st.caption(int8_story.why(table))
        st.dataframe(probs, hide_index=True, key=K("probs_table"))
        better = probs.set_index("variant")["l1_per_row"].idxmin()
        st.caption(f"Attention probabilities stored in 8 bits (MiniLM): {better} survives better — softmax "
                   "spreads tiny weights over every key, which 8 bits flush to zero; ReLU's zeros are exact.")
