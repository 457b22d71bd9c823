"""Figures for the Latency page: pure functions from result tables (the CSV schema of
`python -m attnviz.bench`) and the analyses of `attnviz.latency.compare` to plotly figures.
No Streamlit, no timing, no modelling.

A series is one (model, variant, heads, threads, backend); legends name only what varies, and
every label says "measured" or "modelled" (solid with p10-p90 error bars, or dashed: the legend
does not rely on the dash alone). At most
`MAX_SERIES` series are drawn one by one; the rest (a CSV may name a model per row) are joined
into one grey trace per kind, and the title says how many were drawn. Names from a CSV
(models, variants) are escaped: plotly draws <a href>, <b> and friends in legends and labels.
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnviz.base.numbers import ms
from attnviz.figures.layout import legend_below
from attnviz.latency.compare import crossover_n, fit_quadratic
from attnviz.latency.costmodel import GROUPS

SERIES = ["model", "variant", "n_heads", "threads", "backend", "engine", "dtype"]
GROUP_COLOURS = {"attention": "#d62728", "projections": "#1f77b4", "mlp": "#2ca02c", "other": "#7f7f7f"}
MAX_SERIES = 12   # series drawn one by one: 2,000 traces took 71 s to build and no legend can show them
GREY = "#9e9e9e"
# One colour and one dash per device in every chart (plotly's colour cycle gave a device another
# colour in each chart, and two modelled Pis the same dash): the dash is the device's when the row
# is modelled, solid when it was measured; series of one device differ by their marker.
DEVICE_STYLE = {"cpu": ("#1f77b4", "dashdot"), "cpu-model": ("#17becf", "longdashdot"), "pi4": ("#d62728", "dash"),
                "pi5": ("#2ca02c", "dot")}
OTHER_DEVICE = ("#9467bd", "longdash")
SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "star", "triangle-down", "cross"]
LOG_AXIS = dict(type="log", minorloglabels="complete")  # never "5" for both 0.5 and 500


def device_style(backend, measured: bool, k: int = 0) -> dict:
    """The line and marker of series k of a device (a list of devices drawn as one line: the first's)."""
    backend = backend[0] if isinstance(backend, list) else backend
    colour, dash = DEVICE_STYLE.get(str(backend), OTHER_DEVICE)
    return dict(line=dict(color=colour, dash="solid" if measured else dash),
                marker=dict(color=colour, symbol=SYMBOLS[k % len(SYMBOLS)]))


def _text(value) -> str:
    """User text (a CSV's model names) for a plotly label: shown as typed, never as a link or markup."""
    return html.escape(str(value), quote=False)


def _joined(rows: pd.DataFrame, ids: pd.Series) -> pd.DataFrame:
    """Several series as one table, each sorted by n, with a row of NaN between two series (plotly
    breaks a line there): one trace instead of one per series."""
    rows = rows.assign(series_id=ids).sort_values(["series_id", "seq_len"]).reset_index(drop=True)
    starts = rows.index[rows["series_id"].diff().fillna(0) != 0]
    gaps = pd.DataFrame(np.nan, index=starts - 0.5, columns=rows.columns)
    return pd.concat([rows, gaps]).sort_index().drop(columns="series_id")


def _bounded(df: pd.DataFrame, keys: list[str]):
    """([(key tuple, rows sorted by n)] for the first MAX_SERIES series, [(kind, n series, joined rows)]
    for the rest by kind (measured or not), the number of series)."""
    ids = df.groupby(keys, sort=True).ngroup()
    total = int(ids.max()) + 1 if len(df) else 0
    shown = [(key if isinstance(key, tuple) else (key,), rows.sort_values("seq_len"))
             for key, rows in df[ids < MAX_SERIES].groupby(keys, sort=True)]
    rest = []
    for measured in (True, False):
        part = (ids >= MAX_SERIES) & (df["measured"] == measured if "measured" in df.columns else measured)
        if part.any():
            rest.append((measured, ids[part].nunique(), _joined(df[part], ids[part])))
    return shown, rest, total


def _note(total: int) -> str:
    """What the title says when not every series is drawn one by one."""
    if total <= MAX_SERIES:
        return ""
    return f"<br><sup>{MAX_SERIES} of {total:,} series drawn; the other {total - MAX_SERIES:,} in grey</sup>"


def _varying(df: pd.DataFrame) -> list[str]:
    return [k for k in SERIES if k in df.columns and df[k].nunique() > 1] or ["model"]


def series_count(df: pd.DataFrame) -> int:
    """How many series df holds (the figures draw at most MAX_SERIES of them one by one)."""
    return df.groupby(_varying(df)).ngroups


def _kind(measured: bool) -> str:
    return "measured" if measured else "modelled"


def _label(key: dict, rows: pd.DataFrame, measured: bool) -> str:
    """The keys that vary, then measured or modelled (named, not told by the dash alone); a list of
    backends is one line drawn for several devices ("pi4 = pi5")."""
    parts = [" = ".join(v) if isinstance(v, list) else f"{v} heads" if k == "n_heads" else f"{v} thr"
             if k == "threads" else str(v).removeprefix("synthetic:") for k, v in key.items()]
    if "threads" not in key and str(rows["backend"].iloc[0]).startswith("pi"):
        parts.append(f"{int(rows['threads'].iloc[0])} thr")  # a Pi row always says its threads
    return _text(" · ".join(parts + [_kind(measured)]))


def _same_curve(a: pd.DataFrame, b: pd.DataFrame, y: str) -> bool:
    return len(a) == len(b) and np.array_equal(a["seq_len"].to_numpy(), b["seq_len"].to_numpy()) and \
        np.array_equal(a[y].to_numpy(dtype=float), b[y].to_numpy(dtype=float))


def _one_line_per_curve(entries: list, y: str) -> list:
    """Series that differ only in their backend and draw exactly the same curve become one entry
    whose backend is the list of them: one line, named for every device it stands for."""
    kept = []
    for key, rows, measured in entries:
        rest = {k: v for k, v in key.items() if k != "backend"}
        twin = next((e for e in kept if e[2] == measured and {k: v for k, v in e[0].items() if k != "backend"}
                     == rest and _same_curve(e[1], rows, y)), None)
        if twin is None:
            kept.append(({**key, "backend": [str(key["backend"])]}, rows, measured))
        else:
            twin[0]["backend"].append(str(key["backend"]))
    return kept


def _entries(df: pd.DataFrame, merge_devices: str | None = None):
    """([(key dict, rows, measured)] of the first MAX_SERIES series, the rest by kind, the number of
    series, the keys that vary); `merge_devices` (a column): devices whose curves of it coincide
    are one entry."""
    varying = _varying(df)
    shown, rest, total = _bounded(df, varying)
    entries = [(dict(zip(varying, key)), rows, bool(rows["measured"].iloc[0])) for key, rows in shown]
    if merge_devices and "backend" in varying:
        entries = _one_line_per_curve(entries, merge_devices)
    return entries, rest, total


def _series(df: pd.DataFrame, merge_devices: str | None = None):
    """([(label, rows sorted by n, measured, grey)], number of series); a label holds only the keys
    that vary and says measured or modelled. Past MAX_SERIES, one grey entry per kind holds the rest."""
    entries, rest, total = _entries(df, merge_devices)
    out = [(_label(key, rows, measured), rows, measured, False) for key, rows, measured in entries]
    out += [(f"{count:,} more series {_kind(measured)}", rows, measured, True) for measured, count, rows in rest]
    return out, total


def same_devices(df: pd.DataFrame, y: str = "peak_mem_mb") -> list[str]:
    """The devices drawn as one line because their curves of `y` coincide, e.g. ["pi4 = pi5"]
    (the memory model does not depend on the device)."""
    entries, _, _ = _entries(df.dropna(subset=[y]), merge_devices=y)
    return sorted({" = ".join(key["backend"]) for key, _, _ in entries
                   if isinstance(key.get("backend"), list) and len(key["backend"]) > 1})


def _line(rows, y, label, measured: bool, error=False, mode="lines+markers", grey=False, k: int = 0) -> go.Scatter:
    """One series; its colour and dash are its device's (`device_style`), `k` picks its marker."""
    extra = {}
    if grey:  # the series past MAX_SERIES: context, not read one by one
        extra = dict(line=dict(color=GREY, width=1, dash="solid" if measured else "dash"),
                     marker=dict(color=GREY, size=3), opacity=0.6, hoverinfo="skip")
    else:
        extra = device_style(rows["backend"].iloc[0] if "backend" in rows.columns else "", measured, k)
        if error and measured and {"p10_ms", "p90_ms"} <= set(rows.columns):
            extra["error_y"] = dict(type="data", symmetric=False, array=rows["p90_ms"] - rows["median_ms"],
                                    arrayminus=rows["median_ms"] - rows["p10_ms"], thickness=1)
        if y.endswith("_ms"):   # milliseconds to three significant figures, not "127.4836"
            extra.update(text=[ms(v) for v in rows[y]], hovertemplate="n = %{x}: %{text} ms")
    return go.Scatter(x=rows["seq_len"], y=rows[y], name=label, mode=mode, **extra)


def _symbols(series) -> list[int]:
    """Each series' marker index: its rank among the series of its device."""
    seen, out = {}, []
    for _, rows, _, _ in series:
        b = str(rows["backend"].iloc[0]) if "backend" in rows.columns and len(rows) else ""
        out.append(seen.get(b, 0))
        seen[b] = out[-1] + 1
    return out


def _layout(fig: go.Figure, title: str, y: str, log: bool = False) -> go.Figure:
    fig.update_layout(title=title, xaxis_title="sequence length n (tokens)", yaxis_title=y,
                      legend=legend_below(), margin=dict(t=50, b=10),
                      hovermode="x unified")
    if log:
        fig.update_xaxes(**LOG_AXIS)
        fig.update_yaxes(**LOG_AXIS)
    return fig


def _lines(df: pd.DataFrame, y: str, error: bool = False, mode: str = "lines+markers", suffix: str = "",
           merge_devices: bool = False):
    """The traces of every series of df (bounded) and the title note; `suffix` ends each named
    (not grey) series' label; `merge_devices`: one line for devices whose curves coincide."""
    series, total = _series(df, merge_devices=y if merge_devices else None)
    return [_line(rows, y, label + ("" if grey else suffix), measured, error=error, mode=mode, grey=grey, k=k)
            for (label, rows, measured, grey), k in zip(series, _symbols(series))], _note(total)


def single_length_figure(df: pd.DataFrame, y: str = "median_ms") -> go.Figure:
    """A sweep of one length: one bar per series (a line over one n is dots over an axis of 1.5 tokens),
    p10-p90 on measured bars, each bar labelled in ms to three significant figures."""
    series, total = _series(df)
    fig = go.Figure()
    for label, rows, measured, grey in series:
        colour = GREY if grey else device_style(rows["backend"].iloc[0] if "backend" in rows else "", measured)["line"]["color"]
        error = dict(type="data", symmetric=False, array=rows["p90_ms"] - rows[y], arrayminus=rows[y] - rows["p10_ms"],
                     thickness=1) if measured and {"p10_ms", "p90_ms"} <= set(rows.columns) else None
        fig.add_trace(go.Bar(x=[label], y=[rows[y].iloc[0]], name=label, marker_color=colour, error_y=error,
                             text=[ms(rows[y].iloc[0]) + " ms"], textposition="outside",
                             hovertemplate=f"%{{x}}: %{{text}}<extra></extra>"))
    n = int(df["seq_len"].iloc[0])
    fig.update_layout(title=f"Latency of one forward pass at n = {n} tokens (one length: bars)" + _note(total),
                      yaxis_title="milliseconds", showlegend=False, margin=dict(t=50, b=10))
    return fig


def latency_figure(df: pd.DataFrame, log: bool = False) -> go.Figure:
    """Median latency versus n, every series; p10-p90 bars on measured points. One length: bars."""
    if df["seq_len"].nunique() == 1 and not log:
        return single_length_figure(df)
    traces, note = _lines(df, "median_ms", error=True)
    return _layout(go.Figure(traces), "Latency of one forward pass" + (" (log-log: slope 1 linear, 2 quadratic)"
                                                                      if log else "") + note, "milliseconds", log)


def memory_figure(df: pd.DataFrame, log: bool = False) -> go.Figure:
    """Peak activation memory versus n. The memory model does not depend on the device: modelled
    devices with the same curve are ONE line named for all of them ("pi4 = pi5"), not one drawn
    exactly under another, and the title says so."""
    traces, note = _lines(df.dropna(subset=["peak_mem_mb"]), "peak_mem_mb", merge_devices=True)
    same = same_devices(df)
    if same:
        note += f"<br><sup>{'; '.join(same)}: memory does not depend on the device (one line)</sup>"
    return _layout(go.Figure(traces), "Peak memory of the activations (weights excluded)" + note, "MB", log)


def throughput_figure(df: pd.DataFrame) -> go.Figure:
    traces, note = _lines(df, "tokens_per_s")
    return _layout(go.Figure(traces), "Tokens per second (n / latency)" + note, "tokens / s")


def split_figure(split: pd.DataFrame, title: str = "Where the time goes (cost model)") -> go.Figure:
    """Stacked time per group versus n; `split` has seq_len and one `{group}_ms` column per group."""
    split = split.sort_values("seq_len")
    total = split[[f"{g}_ms" for g in GROUPS]].sum(axis=1)
    fig = go.Figure()
    for g in GROUPS:
        share = 100 * split[f"{g}_ms"] / total
        fig.add_bar(x=split["seq_len"].astype(str), y=split[f"{g}_ms"], name=g, marker_color=GROUP_COLOURS[g],
                    customdata=share, hovertemplate=f"{g}: %{{y:.1f}} ms (%{{customdata:.0f}}%)<extra></extra>")
    fig.update_layout(barmode="stack", title=title, xaxis_title="sequence length n (tokens)",
                      yaxis_title="milliseconds", margin=dict(t=50, b=10), xaxis_type="category")
    return fig


# ---------------------------------------------------------------- fit and crossover
def fit_figure(ns, ms, label: str = "points", attention_n: float | None = None, measured: bool = True) -> go.Figure:
    """Points (named measured or modelled), the fitted a + b n + c n^2, its crossover, and
    (optional) the cost model's n where attention takes half the time."""
    a, b, c = fit_quadratic(ns, ms)
    lo, hi = min(ns), max(ns)
    grid = np.linspace(lo, hi, 200)
    fig = go.Figure([go.Scatter(x=list(ns), y=list(ms), mode="markers",
                                name=_text(f"{label} · {_kind(measured)}")),
                     go.Scatter(x=grid, y=a + b * grid + c * grid ** 2, mode="lines",
                                name=f"fit: {a:.3g} + {b:.3g}·n + {c:.2e}·n²")])  # c is tiny: never "0·n²"
    n_star = crossover_n(a, b, c)
    beyond = []
    for x, text, dash in ((n_star, "c·n² > a + b·n", "dot"), (attention_n, "attention ≥ half (model)", "dash")):
        if x is not None and lo <= x <= hi:
            fig.add_vline(x=x, line_dash=dash, annotation_text=f"{text}: n≈{x:,.0f}")
        elif x is not None:  # marked in the title, not by stretching the axis away from the data
            beyond.append(f"{text} at n≈{x:,.0f}, beyond the swept lengths")
    fig.update_xaxes(range=[lo - 0.02 * (hi - lo), hi + 0.02 * (hi - lo)])
    return _layout(fig, "Quadratic fit of latency" + (f"<br><sup>{'; '.join(beyond)}</sup>" if beyond else ""),
                   "milliseconds")


def growth_figure(df: pd.DataFrame, y: str = "median_ms", title: str = "Growth of latency with n") -> go.Figure:
    """Log-log latency against n, one panel per backend (or per variant when one backend): ticks at
    the swept lengths, slope-1 and slope-2 reference lines through each panel's first point, axes
    cropped to the data. A series whose slope follows the 2-line is quadratic."""
    facet = "backend" if df["backend"].nunique() > 1 else "variant"
    panels = sorted(df[facet].unique(), key=str)[:4]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[_text(p) for p in panels],
                        shared_yaxes=False, horizontal_spacing=0.06)
    ns = sorted(df["seq_len"].unique())
    for j, panel in enumerate(panels, start=1):
        part = df[df[facet] == panel]
        series, _ = _series(part)
        for (label, rows, measured, grey), k in zip(series, _symbols(series)):
            fig.add_trace(_line(rows, y, label, measured, grey=grey, k=k), row=1, col=j)
        first = part.sort_values("seq_len").iloc[0]
        n0, t0 = float(first["seq_len"]), float(part[part["seq_len"] == first["seq_len"]][y].min())
        xs = np.array([n0, float(max(ns))])
        for slope, dash in ((1, "dot"), (2, "dash")):
            fig.add_trace(go.Scatter(x=xs, y=t0 * (xs / n0) ** slope, mode="lines", name=f"slope {slope}",
                                     line=dict(color=GREY, dash=dash, width=1), showlegend=j == 1,
                                     hoverinfo="skip"), row=1, col=j)
        ys = part[y].astype(float)
        fig.update_yaxes(**LOG_AXIS, range=[np.log10(ys.min() * 0.8), np.log10(ys.max() * 1.25)], row=1, col=j)
    fig.update_xaxes(**LOG_AXIS, tickvals=ns, ticktext=[str(int(n)) for n in ns],
                     range=[np.log10(min(ns) * 0.9), np.log10(max(ns) * 1.1)])
    fig.update_layout(title=title + " (log-log: the dotted line is slope 1, linear; the dashed line slope 2, "
                      "quadratic)", legend=legend_below(), margin=dict(t=70, b=10))
    return fig


# ---------------------------------------------------------------- comparisons and model error
def comparison_figure(cmp: pd.DataFrame) -> go.Figure:
    labels = [_text(f"{r.comparison} · {str(r.model).removeprefix('synthetic:')} · {r.variant} · {r.backend}")
              for r in cmp.itertuples()]
    fig = go.Figure(go.Bar(x=cmp["speedup"], y=labels, orientation="h",
                           text=[f"{s:.2f}×" for s in cmp["speedup"]], textposition="auto"))
    fig.add_vline(x=1.0, line_dash="dot")
    fig.update_layout(title="Speed-ups (above 1: the change is faster)", xaxis_title="speed-up ×",
                      height=max(250, 28 * len(cmp) + 120), margin=dict(t=50, b=10))
    return fig


def overlay_figure(measured: pd.DataFrame, modelled: pd.DataFrame, title: str) -> go.Figure:
    """Measured points (with p10-p90) against the model's curves for the same series (the first
    MAX_SERIES of each; the rest joined in grey)."""
    points, note = _lines(measured, "median_ms", error=True, mode="markers")
    profile = ", ".join(sorted({str(b) for b in modelled["backend"]})) if "backend" in modelled else ""
    curves, _ = _lines(modelled, "median_ms", suffix=f" ({_text(profile)})" if profile else "")
    return _layout(go.Figure(points + curves), title + note, "milliseconds", log=True)


def error_figure(err: pd.DataFrame, target_pct: float = 15.0) -> go.Figure:
    """Model error (%) versus n per model and variant (the first MAX_SERIES; the rest in grey), with
    the ± target band."""
    fig = go.Figure()
    shown, rest, total = _bounded(err.assign(measured=True), ["model", "variant"])
    for (model, variant), rows in shown:
        fig.add_scatter(x=rows["seq_len"], y=rows["error_pct"], mode="lines+markers",
                        name=_text(f"{model} · {variant}"))
    for _, count, rows in rest:
        fig.add_trace(_line(rows, "error_pct", f"{count:,} more series", True, grey=True))
    fig.add_hrect(y0=-target_pct, y1=target_pct, fillcolor="green", opacity=0.1, line_width=0)
    fig.update_xaxes(**LOG_AXIS)
    return _layout(fig, f"Cost model error against measurement (band: ±{target_pct:g}%)" + _note(total), "error %")


# ---------------------------------------------------------------- decode (llama-bench's pp / tg / depth)
def decode_figure(df: pd.DataFrame) -> go.Figure:
    """Generation tokens/s (tg) against KV-cache depth, one line per model, backend, engine and dtype
    (measured solid, modelled dashed); the pp rows' tokens/s in the hover text."""
    tg = df[df["test"] == "tg"].sort_values("depth")
    fig = go.Figure()
    keys = [k for k in ("model", "backend", "engine", "dtype", "threads") if k in tg.columns]
    per_device = {}
    for i, (key, rows) in enumerate(tg.groupby(keys, sort=True)):
        if i >= MAX_SERIES:
            break
        measured = bool(rows["measured"].iloc[0])
        label = " · ".join([f"{v} thr" if k == "threads" else str(v).removeprefix("synthetic:")
                            for k, v in zip(keys, key)] + [_kind(measured)])
        b = str(rows["backend"].iloc[0])
        per_device[b] = per_device.get(b, -1) + 1
        fig.add_scatter(x=rows["depth"], y=rows["tg_tps"], mode="lines+markers", name=_text(label),
                        **device_style(b, measured, per_device[b]))
    fig.update_layout(title="Generation speed against KV-cache depth (tg at -d depth)" + _note(
        tg.groupby(keys).ngroups if len(tg) else 0), xaxis_title="tokens already in the cache (depth)",
        yaxis_title="generated tokens / s", legend=legend_below(),
        margin=dict(t=50, b=10))
    fig.update_yaxes(**LOG_AXIS)
    return fig


def decode_table(df: pd.DataFrame) -> pd.DataFrame:
    """pp and tg tokens/s per model, backend, engine, dtype and depth (the throughput table the Latency page shows)."""
    rows = df[df["test"].isin(["pp", "tg"])]
    return rows[["model", "backend", "measured", "engine", "dtype", "threads", "test", "n_prompt", "depth",
                 "pp_tps", "tg_tps"]].reset_index(drop=True)
