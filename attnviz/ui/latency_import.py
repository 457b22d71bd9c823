"""The Latency page's import of a CSV measured on a real device (`python -m attnviz.bench` on a
Pi): checked and modelled once per file in a heavy-job slot, drawn against the cost model, and
optionally used to recalibrate the Pi profile that new sweeps on the page use."""
from __future__ import annotations

import streamlit as st

from attnviz.base import jobs
from attnviz.base.limits import LIMITS
from attnviz.figures import latency_figures
from attnviz.latency import compare, costmodel, results
from attnviz.ui import common, job_controls
from attnviz.ui.latency_sweep import K, PROFILES


# ---------------------------------------------------------------- a CSV from a real device
@st.cache_data(max_entries=4, show_spinner="Checking the CSV…")
def checked_csv(data: bytes):
    """read_results on these bytes once, in a heavy-job slot: (table, None) or (None, the reason it
    is refused). A busy server or a deadline raises (and is not cached)."""
    with job_controls.heavy_job("a latency CSV import"):
        try:
            imported = results.read_results(data)
            if not imported["measured"].any():
                raise ValueError("this CSV holds modelled rows only; upload one measured on the device")
            return imported, None
        except (jobs.ServerBusy, jobs.JobTimeout, jobs.JobCancelled):
            raise
        except ValueError as err:
            return None, str(err)


@st.cache_data(max_entries=8, show_spinner="Modelling the CSV's points…")
def modelled_csv(data: bytes, base: str, recalibrate: bool):
    """(profile, model error table, overlay figure, series drawn, series in all) for these bytes
    and this profile, made once (a rerun, a download or another view reuses it) in a heavy-job
    slot with a deadline; or the reason the fit failed, as text."""
    imported, _ = checked_csv(data)
    with job_controls.heavy_job("a latency CSV import") as cancel:
        check = jobs.checks(jobs.Deadline(LIMITS.max_sweep_seconds, "modelling the CSV"), cancel)
        try:
            prof = compare.recalibrate_from(imported, costmodel.PROFILES[base], check) if recalibrate else costmodel.PROFILES[base]
        except (jobs.ServerBusy, jobs.JobTimeout, jobs.JobCancelled):
            raise
        except ValueError as err:
            return str(err)
        meas = imported[imported["measured"]]
        twins = compare.modelled_like(meas, prof, check=check)
        err = compare.model_error(meas, prof, twins)
        fig = latency_figures.overlay_figure(meas, twins, f"Measured on the device vs {prof.name}")
    series = latency_figures.series_count(meas)
    return prof, err, fig, min(series, latency_figures.MAX_SERIES), series


def device_import():
    st.subheader("Measurements from a Raspberry Pi")
    st.caption("On the Pi: `python -m attnviz.bench --model minilm --seq-lens 16,32,64,128,256 --threads 4 "
               "--out pi.csv`, then upload `pi.csv`.")
    cap = min(LIMITS.max_upload_bytes, results.MAX_CSV_BYTES)
    upload = st.file_uploader(f"CSV from python -m attnviz.bench (at most {cap / 1e6:g} MB and "
                              f"{results.MAX_CSV_ROWS:,} rows)", type=["csv"], key=K("upload"))
    if upload is None:
        return
    name = common.plain(upload.name)
    if upload.size > cap:
        st.error(f"Cannot use {name}: it is {upload.size / 1e6:,.1f} MB; this page reads CSV files of at most "
                 f"{cap / 1e6:g} MB ({results.MAX_CSV_ROWS:,} rows). Split the sweep into several files.")
        return
    data = upload.getvalue()
    profiles = st.session_state.setdefault(PROFILES, {})
    try:
        imported, problem = checked_csv(data)
        if problem:
            st.error(f"Cannot use {name}: {common.plain(problem)}")
            return
        cpu_name = str(imported["cpu"].iloc[0])
        guess = "pi5" if "Pi 5" in cpu_name else "pi4"
        base = st.selectbox("Compare with the profile", ["pi4", "pi5"], index=["pi4", "pi5"].index(guess),
                            key=K("import_profile"), help=f"The CSV says the CPU is: {common.plain(cpu_name)}")
        recalibrate = st.checkbox(f"Recalibrate the {base} profile from these measurements", key=K("recalibrate"))
        modelled = modelled_csv(data, base, recalibrate)
        if isinstance(modelled, str):  # the fit failed: compare with the published profile
            st.error(common.plain(modelled))
            modelled = modelled_csv(data, base, False)
            profiles.pop(base, None)
        elif recalibrate:
            profiles[base] = modelled[0]
            st.success(f"{common.plain(modelled[0].source)}. New sweeps on this page use it for {base}.")
        else:
            profiles.pop(base, None)
    except ValueError as err:  # the server is busy, or modelling ran past its deadline
        st.error(f"Cannot import {name} now: {common.plain(str(err))}")
        return
    prof, err, fig, drawn, series = modelled
    st.plotly_chart(fig, key=K("fig_overlay"))
    if drawn < series:
        st.caption(f"{series:,} series in this file: the first {drawn} are drawn one by one, the other "
                   f"{series - drawn:,} together in grey; the table below lists every point.")
    st.metric(f"Largest error of the {prof.name} model", f"{err['error_pct'].abs().max():.1f} %")
    st.dataframe(err, hide_index=True, key=K("import_errors"))
