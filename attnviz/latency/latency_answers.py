"""The Latency page's headline answers as sentences built from the numbers, each figure with its band.

- `sweep_sentence(df)`: a sweep's answer for its first model: the longest length measured here (with
  its p10–p90) and modelled on each Pi (with the cost model's ±25 % band), and what doubling n costs.
- `heads_tradeoff_sentence(table)`: 4 heads against 8 at equal d_model (`tradeoff.heads_table`).
- `halved_name(n_heads)`, `halved_sentence(...)`: the corpus run that halves each layer's heads,
  named for the model picked, its cost in a metric and the Pi latency it saves.
The int8 story (one table per model, modelled Pi and measured here side by side) is `int8_story`.
"""
from __future__ import annotations

import pandas as pd

from attnviz.base.numbers import interval, ms, number

PI_BAND = 0.25      # tests/test_costmodel.py checks the modelled Pi rows against published runs within ±25 %
DEVICES = {"pi4": "Pi 4", "pi5": "Pi 5", "cpu": "this CPU"}


def band(x: float) -> str:
    """A modelled figure's band: "(modelled, ±25 %: 83.7–140 ms)"."""
    return f"(modelled, ±{PI_BAND:.0%}: {ms(x * (1 - PI_BAND))}–{ms(x * (1 + PI_BAND))} ms)"


def sweep_sentence(df: pd.DataFrame, quote=str) -> str | None:
    """The sweep's first model at its longest length and first variant, every head, one thread count.
    `quote`: how the model's name is written (a page escapes a typed synthetic shape)."""
    if df is None or df.empty:
        return None
    model, variant = df["model"].iloc[0], df["variant"].iloc[0]
    rows = df[(df["model"] == model) & (df["variant"] == variant)]
    if "n_heads" in rows:
        rows = rows[rows["n_heads"] == rows["n_heads"].max()]
    if "dtype" in rows:
        rows = rows[rows["dtype"] == rows["dtype"].iloc[0]]
    if "engine" in rows:
        rows = rows[rows["engine"].isin([rows["engine"].iloc[0], "", None]) | rows["engine"].isna()]
    n = int(rows["seq_len"].max())
    parts = []
    for device, name in DEVICES.items():
        at = rows[(rows["backend"] == device) & (rows["seq_len"] == n)]
        if at.empty:
            continue
        r = at.sort_values("threads").iloc[0] if device == "cpu" else at.sort_values("threads").iloc[-1]
        if device == "cpu":
            parts.append(f"{ms(r['median_ms'])} ms on {name} (measured, p10–p90 {ms(r['p10_ms'])}–{ms(r['p90_ms'])} ms, "
                         f"{int(r['threads'])} thread{'s' if int(r['threads']) != 1 else ''})")
        else:
            parts.append(f"{ms(r['median_ms'])} ms on a {name} {band(r['median_ms'])}")
    if not parts:
        return None
    text = f"One forward pass of {quote(model)} ({variant}) over {n} tokens takes " + "; ".join(parts) + "."
    half = n // 2
    where = "cpu" if (rows["backend"] == "cpu").any() else rows["backend"].iloc[0]   # measured first
    first = rows[rows["backend"] == where]
    if where == "cpu":
        first = first[first["threads"] == first["threads"].min()]
    a, b = first[first["seq_len"] == half], first[first["seq_len"] == n]
    if len(a) and len(b):
        growth = float(b["median_ms"].iloc[0]) / float(a["median_ms"].iloc[0])
        text += (f" Doubling the text from {half} to {n} tokens multiplies the time by {growth:.2f}× on "
                 f"{DEVICES.get(where, where)} (2× would be linear, 4× all "
                 "attention).")
    return text


def heads_tradeoff_sentence(table: pd.DataFrame, device: str = "pi4", engine: str = "torch fp32") -> str | None:
    """The synthetic shape's 4 heads against its 8 at equal d_model, on one Pi and engine."""
    col = f"{device} {engine} ms"
    if table is None or table.empty or col not in table.columns:
        return None
    shapes = table[table["shape"].str.startswith("layers=")]
    four, eight = shapes[shapes["n_heads"] == 4], shapes[shapes["n_heads"] == 8]
    if four.empty or eight.empty:
        return None
    f, e = four.iloc[0], eight.iloc[0]
    change = e[col] / f[col] - 1
    text = (f"At d_model {int(f['d_model'])} and {int(f['tokens'])} tokens, 8 heads of {int(e['d_head'])} instead of 4 "
            f"of {int(f['d_head'])} cost {change:+.1%} on a {DEVICES[device]} with {engine} ({ms(f[col])} → "
            f"{ms(e[col])} ms, modelled ±{PI_BAND:.0%})")
    toys = table[~table["shape"].str.startswith("layers=") & table["exact_accuracy"].notna()]
    if len(toys) >= 2:
        t4, t8 = toys.sort_values("n_heads").iloc[0], toys.sort_values("n_heads").iloc[-1]
        if round(t8["exact_accuracy"] - t4["exact_accuracy"], 2) == 0:
            text += (f"; on the Lab's recall toy both reach exact accuracy {t4['exact_accuracy']:.2f}, so the extra "
                     "heads buy nothing there")
        else:
            text += (f"; on the Lab's recall toy, {int(t8['n_heads'])} heads reach exact accuracy "
                     f"{t8['exact_accuracy']:.2f} against {t4['exact_accuracy']:.2f} with {int(t4['n_heads'])}")
    return text + ": more, narrower heads cost almost nothing more on the Pi."


def halved_name(n_heads: int) -> str:
    """The corpus run that keeps each layer's more important half, named for the model picked."""
    return f"each layer's {n_heads} heads halved to {max(1, n_heads // 2)}"


def pi_saving(priced, device: str) -> str | None:
    """"saves 6 % on a Pi 4 (112 → 106 ms, modelled ±25 %)" from `tradeoff.kept_heads_latency`'s rows."""
    if not isinstance(priced, pd.DataFrame) or priced.empty:
        return None
    rows = priced[priced["device"] == device]
    if rows.empty:
        return None
    r = rows.iloc[0]
    saved = 1 - r["kept_ms"] / r["full_ms"]
    return (f"{'saves' if saved >= 0 else 'costs'} {abs(saved):.0%} on a {DEVICES[device]} "
            f"({ms(r['full_ms'])} → {ms(r['kept_ms'])} ms, modelled ±{PI_BAND:.0%})")


def halved_sentence(summary: pd.DataFrame, metric: str, label: str, n_heads: int, priced,
                    n_items: int) -> str | None:
    """The halved model's `metric` over the corpus (its label `label`) and the Pi latency it saves."""
    if summary is None or summary.empty or "metric" not in summary.columns:
        return None
    rows = summary[(summary["metric"] == metric) & (summary["order"] == "halved")]
    if rows.empty:
        return None
    r = rows.iloc[0]
    value = float(r["value"])
    change = f", {value - 1:+.1%} from the full model's 1" if metric in ("cosine", "top1", "nn_agreement", "chrf") else ""
    savings = [s for s in (pi_saving(priced, d) for d in ("pi4", "pi5")) if s]
    name = halved_name(n_heads)
    return (f"{name[0].upper()}{name[1:]} (the more important half kept) gives {label} {number(value)}"
            f"{interval(r['ci_low'], r['ci_high'])} over {n_items} items{change}"
            + (f", and {' and '.join(savings)}" if savings else "") + ".")
