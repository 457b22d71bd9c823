"""Latency: what attention costs as sequences grow, measured on this CPU and modelled for a
Raspberry Pi; a CSV from a real Pi overlays measured on modelled. Layout only: the work is in
attnviz.bench (timing, sweeps), attnviz.costmodel, attnviz.results (CSV) and attnviz.latency_figures."""
import os

import streamlit as st

from attnviz import bench, costmodel as cm, latency_figures as lf, results, ui
from attnviz.limits import LIMITS
from attnviz.loading import BUNDLED

st.set_page_config(page_title="attnviz · Latency", layout="wide")
st.title("Latency")
st.caption("One forward pass, batch 1, float32. **cpu** is measured here; **pi4** / **pi5** come from a "
           "cost model built on published Raspberry Pi figures; a CSV from `python -m attnviz.bench` run on a "
           "real Pi can be imported below.")
ss = st.session_state
ss.setdefault("lat_profiles", {})  # Pi profiles recalibrated from an imported CSV
VARIANTS = ["fused", "eager", "chunked:128", "local:64", "linear", "relu"]
CORES = os.cpu_count() or 1


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
    threads = c2.multiselect("Threads", list(range(1, CORES + 1)), default=[min(CORES, 1)], key="lat_threads")
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

if run:
    try:
        models = picked + [s.strip() for s in specs.splitlines() if s.strip()]
        plan = bench.SweepPlan(
            models=models, seq_lens=bench.parse_int_list(seq_text, "Sequence lengths"), variants=variants,
            heads=None if heads_text.strip().lower() == "all" else bench.parse_int_list(heads_text, "Heads"),
            threads=[int(t) for t in threads], backends=backends, repeats=int(repeats), warmup=int(warmup),
            memory=memory, clock=clock).check()
        with st.spinner("Loading models and calibrating this CPU…"):
            configs = bench.configs_of(plan.models, loader=get_model)
            host = bench.host_profile(plan.threads[0], clock)
        est = bench.estimate(plan, configs, host)
        est.check(max_s, max_mb)
    except ValueError as err:
        st.error(str(err))
        st.stop()
    bar = st.progress(0.0, text=f"{est.points} points, about {est.seconds:,.0f} s")
    df = bench.run_sweep(plan, {k: get_model(k) for k in plan.models}, profiles=ss["lat_profiles"],
                         progress=lambda i, n, label: bar.progress(i / max(n, 1), text=label))
    bar.empty()
    ss["lat_results"] = df

# --- Results ---------------------------------------------------------------------------------
df = ss.get("lat_results")
if df is None:
    st.info("Choose models, variants and sequence lengths, then press Run.")
else:
    st.dataframe(df[[c for c in results.COLUMNS[1:14] if c != "shape"]], hide_index=True, key="lat_table")
    st.download_button("Download CSV", results.to_csv(df), "attnviz-latency.csv", "text/csv", key="lat_download")
    tabs = st.tabs(["Latency", "Split and fit", "Memory", "Tokens/s", "Comparisons", "Model error"])
    with tabs[0]:
        st.plotly_chart(lf.latency_figure(df), key="lat_fig_linear")
        st.plotly_chart(lf.latency_figure(df, log=True), key="lat_fig_log")
    with tabs[1]:
        c1, c2, c3 = st.columns(3)
        key = c1.selectbox("Model", sorted(df["model"].unique()), key="lat_split_model")
        variant = c2.selectbox("Variant", sorted(df["variant"].unique()), key="lat_split_variant")
        names = {"cpu (this host)": None, **{b: b for b in ("pi4", "pi5")}}
        where = c3.selectbox("Device", list(names), key="lat_split_device")
        sel = df[(df["model"] == key) & (df["variant"] == variant)]
        sel = sel[sel["n_heads"] == sel["n_heads"].max()]
        cfg, b, run_clock = results.row_config(sel.iloc[0]), names[where], str(df["clock"].iloc[0])
        if b is None:
            prof = bench.host_profile(int(sel["threads"].min()), run_clock)
        else:
            prof = ss["lat_profiles"].get(b, cm.PROFILES[b])
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
        st.caption(f"Pruning half the heads can speed {key} up by at most "
                   f"{cm.speedup_bound(cfg, ns[-1], 0.5, prof, variant):.2f}× at n = {ns[-1]} (only the per-head "
                   "work shrinks: attention and the Q/K/V/output projections; the MLP stays).")
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
            err = bench.host_model_error(df)
            st.metric("Largest cost-model error here", f"{err['error_pct'].abs().max():.1f} %")
            st.plotly_chart(lf.error_figure(err), key="lat_fig_error")
            st.caption("On a busy machine choose the cpu clock with one thread: wall time then includes "
                       "other programs, which no cost model can predict.")

# --- Import a CSV from a real device -------------------------------------------------------
st.subheader("Measurements from a Raspberry Pi")
st.caption("On the Pi: `python -m attnviz.bench --model minilm --seq-lens 16,32,64,128,256 --threads 4 "
           "--out pi.csv`, then upload `pi.csv`.")
upload = st.file_uploader("CSV from python -m attnviz.bench", type=["csv"], key="lat_upload")
if upload is not None:
    try:
        imported = results.read_results(upload.getvalue())
        if not imported["measured"].any():
            raise ValueError("this CSV holds modelled rows only; upload one measured on the device")
    except ValueError as err:
        st.error(f"Cannot use {upload.name}: {err}")
        st.stop()
    cpu_name = str(imported["cpu"].iloc[0])
    guess = "pi5" if "Pi 5" in cpu_name else "pi4"
    base = st.selectbox("Compare with the profile", ["pi4", "pi5"], index=["pi4", "pi5"].index(guess),
                        key="lat_import_profile", help=f"The CSV says the CPU is: {cpu_name}")
    prof = cm.PROFILES[base]
    if st.checkbox(f"Recalibrate the {base} profile from these measurements", key="lat_recalibrate"):
        try:
            prof = ss["lat_profiles"][base] = lf.recalibrate_from(imported, cm.PROFILES[base])
            st.success(f"{prof.source}. New sweeps on this page use it for {base}.")
        except ValueError as err:
            st.error(ui.plain(err))
    elif base in ss["lat_profiles"]:
        del ss["lat_profiles"][base]
    meas = imported[imported["measured"]]
    st.plotly_chart(lf.overlay_figure(meas, lf.modelled_like(meas, prof), f"Measured on the device vs {prof.name}"),
                    key="lat_fig_overlay")
    err = lf.model_error(meas, prof)
    st.metric(f"Largest error of the {prof.name} model", f"{err['error_pct'].abs().max():.1f} %")
    st.dataframe(err, hide_index=True, key="lat_import_errors")
