"""Latency: what attention costs as sequences grow, measured on this CPU and modelled for a
Raspberry Pi; a CSV from a real Pi overlays measured on modelled. Layout only: the work is in
attnviz.bench (timing, sweeps), attnviz.costmodel, attnviz.results (CSV) and attnviz.latency_figures."""
import os

import streamlit as st

from attnviz.latency import sweep as bench
from attnviz.latency import costmodel as cm
from attnviz.base import jobs
from attnviz.figures import latency as lf
from attnviz.latency import results
from attnviz import ui
from attnviz.base.limits import LIMITS
from attnviz.weights.catalogue import BUNDLED

st.set_page_config(page_title="attnviz · Latency", layout="wide")
st.title("Latency")
st.caption("One forward pass, batch 1, float32. **cpu** is measured here; **pi4** / **pi5** come from a "
           "cost model built on published Raspberry Pi figures; a CSV from `python -m attnviz.bench` run on a "
           "real Pi can be imported below.")
ss = st.session_state
ss.setdefault("lat_profiles", {})  # Pi profiles recalibrated from an imported CSV
VARIANTS = ["fused", "eager", "chunked:128", "local:64", "linear", "relu"]
CORES = os.cpu_count() or 1
HERE = bench.threads_now()  # this server's torch threads: other counts are measured in a separate process
CSV_CAP = min(LIMITS.max_upload_bytes, results.MAX_CSV_BYTES)


@st.cache_resource(max_entries=8, show_spinner=False)
def synthetic(spec: str):
    return bench.load(spec)


def get_model(key: str):
    return synthetic(key) if key.startswith("synthetic:") else ui.load_model(key)


# --- Inputs ----------------------------------------------------------------------------------
with st.form("lat_form"):
    c1, c2, c3 = st.columns(3)
    picked = c1.multiselect("Models", list(BUNDLED), default=["minilm"], key="lat_models")
    specs = c1.text_area("Synthetic shapes (one per line)", key="lat_synthetic", height=68,
                         placeholder="synthetic:layers=6,d=384,heads=8",
                         help="Random weights, for timing: layers, d, heads; optional kv, dh, ff, vocab, "
                              "positions, causal=1, family")
    variants = c2.multiselect("Attention variants", VARIANTS, default=["fused"], key="lat_variants")
    seq_text = c2.text_input("Sequence lengths", "16,32,64,128,256", key="lat_seq")
    heads_text = c2.text_input("Heads kept per layer", "all", key="lat_heads",
                               help="'all', or counts such as 4,8: the first k heads of every layer, pruned")
    threads = c2.multiselect("Threads", sorted(set(range(1, CORES + 1)) | {HERE}), default=[HERE],
                             key="lat_threads", help=f"this server runs on {HERE}; other thread counts are "
                             "measured in a separate process (torch's thread count is shared by every session here)")
    backends = c3.multiselect("Backends", ["cpu", "pi4", "pi5"], default=["cpu", "pi4", "pi5"], key="lat_backends")
    repeats = c3.number_input("Repeats", 1, 50, 3, key="lat_repeats")
    warmup = c3.number_input("Warm-up runs", 0, 10, 1, key="lat_warmup")
    clock = c3.radio("Clock", ["wall", "cpu"], horizontal=True, key="lat_clock",
                     help="cpu: this process's CPU time; ignores other programs on a busy machine (1 thread)")
    memory = c3.checkbox("Measure peak memory", True, key="lat_memory")
    b1, b2 = st.columns(2)
    cap_s, cap_mb = int(LIMITS.max_sweep_seconds), int(min(bench.memory_budget_mb(), LIMITS.max_sweep_memory_mb))
    max_s = b1.number_input("Time budget (s)", 1, cap_s, min(120, cap_s), key="lat_budget_s",
                            help=f"at most {cap_s} s on this server (ATTNVIZ_MAX_SWEEP_SECONDS)")
    max_mb = b2.number_input("Memory budget (MB)", 100, max(100, cap_mb), max(100, cap_mb), key="lat_budget_mb",
                             help="at most half the free memory, and ATTNVIZ_MAX_SWEEP_MEMORY_MB")
    run = st.form_submit_button("Run", type="primary")


def sweep():
    """The form's sweep, or a ValueError before any work when it is bad, over budget or the server
    is busy. It stops at the time budget, keeping what it measured (`attrs["stopped"]` says so)."""
    models = picked + [s.strip() for s in specs.splitlines() if s.strip()]
    plan = bench.SweepPlan(
        models=models, seq_lens=bench.parse_int_list(seq_text, "Sequence lengths"), variants=variants,
        heads=None if heads_text.strip().lower() == "all" else bench.parse_int_list(heads_text, "Heads"),
        threads=[int(t) for t in threads], backends=backends, repeats=int(repeats), warmup=int(warmup),
        memory=memory, clock=clock).check()
    configs = bench.configs_of(plan.models, loader=get_model)  # synthetic shapes: parsed, not built
    bench.estimate(plan, configs, cm.HOST_GUESS).check(None, max_mb)  # memory does not need a calibration
    with jobs.heavy_job("a latency sweep"):
        with st.spinner("Calibrating this CPU…"):
            here = bench.host_profile(HERE, clock)
        est = bench.estimate(plan, configs, here)
        est.check(max_s, max_mb)
        deadline = jobs.Deadline(max_s, "the sweep")
        bar = st.progress(0.0, text=f"{est.points} points, about {est.seconds:,.0f} s (stops at {max_s} s)")
        df = bench.run_sweep(plan, {k: get_model(k) for k in plan.models}, profiles=ss["lat_profiles"],
                             deadline=deadline, progress=lambda i, n, label: bar.progress(
                                 min(i / max(n, 1), 1.0), text=ui.plain(label)))
        bar.empty()
        with st.spinner("Calibrating this CPU at the sweep's thread counts…"):
            for t in sorted(set(plan.threads) - {HERE}):  # the cost-model tabs need them: here, in the slot
                try:
                    bench.host_profile(t, clock)
                except ValueError:
                    break  # the tabs say why
    return df


def host(threads: int, clock: str):
    """This CPU's calibrated profile at a thread count (a separate process for other counts), or None
    after showing why not."""
    try:
        return bench.host_profile(int(threads), clock)
    except ValueError as err:
        st.error(ui.plain(str(err)))
        return None


if run:
    try:
        swept = sweep()
    except ValueError as err:  # bad input, over budget, server busy: what was on screen stays
        st.error(ui.plain(str(err)))
    else:
        ss["lat_results"], ss["lat_stopped"] = swept, swept.attrs.get("stopped", "")


def split_and_fit(df):
    """Where the time goes (cost model) on a device, and the quadratic fit of a series."""
    c1, c2, c3 = st.columns(3)
    key = c1.selectbox("Model", sorted(df["model"].unique()), key="lat_split_model")
    variant = c2.selectbox("Variant", sorted(df["variant"].unique()), key="lat_split_variant")
    names = {"cpu (this host)": None, **{b: b for b in ("pi4", "pi5")}}
    where = c3.selectbox("Device", list(names), key="lat_split_device")
    sel = df[(df["model"] == key) & (df["variant"] == variant)]
    sel = sel[sel["n_heads"] == sel["n_heads"].max()]
    cfg, b, run_clock = results.row_config(sel.iloc[0]), names[where], str(df["clock"].iloc[0])
    prof = host(sel["threads"].min(), run_clock) if b is None else ss["lat_profiles"].get(b, cm.PROFILES[b])
    if prof is None:
        return
    ns = sorted(sel["seq_len"].unique())
    split = lf.split_table(cfg, ns, prof, variant)
    st.plotly_chart(lf.split_figure(split, f"Where the time goes on {where} (cost model)"), key="lat_fig_split")
    pts = sel[sel["backend"] == ("cpu" if b is None else b)]
    pts = pts[pts["threads"] == pts["threads"].min()]
    if pts.empty:  # that device was not in the sweep: fit the model's own curve
        pts = split.assign(median_ms=split.drop(columns="seq_len").sum(axis=1))
    cross = cm.attention_crossover(cfg, prof, variant)
    if pts["seq_len"].nunique() >= 3:
        st.plotly_chart(lf.fit_figure(pts["seq_len"], pts["median_ms"], f"{key} · {where}", cross),
                        key="lat_fig_fit")
    else:
        st.info("The quadratic fit needs at least three sequence lengths.")
    st.caption(f"Attention takes half the time from n ≈ {cross:,} on {where}." if cross else
               f"With {variant}, attention never takes half the time on {where} (up to 65,536 tokens).")
    st.caption(f"Pruning half the heads can speed {ui.plain(key)} up by at most "
               f"{cm.speedup_bound(cfg, ns[-1], 0.5, prof, variant):.2f}× at n = {ns[-1]} (only the per-head "
               "work shrinks: attention and the Q/K/V/output projections; the MLP stays).")


# --- Results ---------------------------------------------------------------------------------
df = ss.get("lat_results")
if df is not None and ss.get("lat_stopped"):
    st.warning(ui.plain(ss["lat_stopped"]) + (" Nothing was measured: raise the time budget or choose a smaller "
                                              "sweep." if df.empty else ""))
if df is None or df.empty:
    st.info("Choose models, variants and sequence lengths, then press Run.")
else:
    st.dataframe(df[[c for c in results.COLUMNS[1:14] if c != "shape"]], hide_index=True, key="lat_table")
    # results.to_csv is exports.csv_text: text cells that a spreadsheet would run as formulas are neutralised
    st.download_button("Download CSV", results.to_csv(df), "attnviz-latency.csv", "text/csv", key="lat_download")
    tabs = st.tabs(["Latency", "Split and fit", "Memory", "Tokens/s", "Comparisons", "Model error"])
    with tabs[0]:
        st.plotly_chart(lf.latency_figure(df), key="lat_fig_linear")
        st.plotly_chart(lf.latency_figure(df, log=True), key="lat_fig_log")
    with tabs[1]:
        split_and_fit(df)
    with tabs[2]:
        st.plotly_chart(lf.memory_figure(df), key="lat_fig_memory")
    with tabs[3]:
        st.plotly_chart(lf.throughput_figure(df), key="lat_fig_tps")
    with tabs[4]:
        cmp = lf.compare(df)
        if cmp.empty:
            st.info("Comparisons need n and n/2, several head counts, or fused beside another variant.")
        else:
            st.plotly_chart(lf.comparison_figure(cmp), key="lat_fig_compare")
            st.dataframe(cmp, hide_index=True, key="lat_compare_table")
    with tabs[5]:
        if not df["measured"].any():
            st.info("Include the cpu backend to compare this host's measurements with its cost model.")
        else:
            try:
                err = bench.host_model_error(df)
            except ValueError as problem:  # calibrating at another thread count failed
                st.error(ui.plain(str(problem)))
            else:
                st.metric("Largest cost-model error here", f"{err['error_pct'].abs().max():.1f} %")
                st.plotly_chart(lf.error_figure(err), key="lat_fig_error")
                st.caption("On a busy machine choose the cpu clock with one thread: wall time then includes "
                           "other programs, which no cost model can predict.")

# --- Import a CSV from a real device -------------------------------------------------------


@st.cache_data(max_entries=4, show_spinner="Checking the CSV…")
def checked_csv(data: bytes):
    """read_results on these bytes once: (table, None) or (None, the reason it is refused)."""
    try:
        imported = results.read_results(data)
        if not imported["measured"].any():
            raise ValueError("this CSV holds modelled rows only; upload one measured on the device")
        return imported, None
    except ValueError as err:
        return None, str(err)


@st.cache_data(max_entries=8, show_spinner="Modelling the CSV's points…")
def modelled_csv(data: bytes, base: str, recalibrate: bool):
    """(profile, measured rows, their modelled twins, errors) for these bytes, or an error text."""
    imported, _ = checked_csv(data)
    try:
        prof = lf.recalibrate_from(imported, cm.PROFILES[base]) if recalibrate else cm.PROFILES[base]
    except ValueError as err:
        return str(err)
    meas = imported[imported["measured"]]
    return prof, meas, lf.modelled_like(meas, prof), lf.model_error(meas, prof)


st.subheader("Measurements from a Raspberry Pi")
st.caption("On the Pi: `python -m attnviz.bench --model minilm --seq-lens 16,32,64,128,256 --threads 4 "
           "--out pi.csv`, then upload `pi.csv`.")
upload = st.file_uploader(f"CSV from python -m attnviz.bench (at most {CSV_CAP / 1e6:g} MB and "
                          f"{results.MAX_CSV_ROWS:,} rows)", type=["csv"], key="lat_upload")
if upload is not None:
    name = ui.plain(upload.name)
    if upload.size > CSV_CAP:
        st.error(f"Cannot use {name}: it is {upload.size / 1e6:,.1f} MB; this page reads CSV files of at most "
                 f"{CSV_CAP / 1e6:g} MB ({results.MAX_CSV_ROWS:,} rows). Split the sweep into several files.")
        st.stop()
    data = upload.getvalue()
    imported, problem = checked_csv(data)
    if problem:
        st.error(f"Cannot use {name}: {ui.plain(problem)}")
        st.stop()
    cpu_name = str(imported["cpu"].iloc[0])
    guess = "pi5" if "Pi 5" in cpu_name else "pi4"
    base = st.selectbox("Compare with the profile", ["pi4", "pi5"], index=["pi4", "pi5"].index(guess),
                        key="lat_import_profile", help=f"The CSV says the CPU is: {ui.plain(cpu_name)}")
    recalibrate = st.checkbox(f"Recalibrate the {base} profile from these measurements", key="lat_recalibrate")
    modelled = modelled_csv(data, base, recalibrate)
    if isinstance(modelled, str):  # the fit failed: compare with the published profile
        st.error(ui.plain(modelled))
        modelled = modelled_csv(data, base, False)
        ss["lat_profiles"].pop(base, None)
    elif recalibrate:
        ss["lat_profiles"][base] = modelled[0]
        st.success(f"{ui.plain(modelled[0].source)}. New sweeps on this page use it for {base}.")
    else:
        ss["lat_profiles"].pop(base, None)
    prof, meas, twins, err = modelled
    st.plotly_chart(lf.overlay_figure(meas, twins, f"Measured on the device vs {prof.name}"), key="lat_fig_overlay")
    st.metric(f"Largest error of the {prof.name} model", f"{err['error_pct'].abs().max():.1f} %")
    st.dataframe(err, hide_index=True, key="lat_import_errors")
