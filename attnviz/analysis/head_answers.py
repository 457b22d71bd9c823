"""The headline answers as sentences built from the numbers, with the interval beside each figure.

The charts answer "what happens if I remove heads?" only for a reader who knows where to look; these
functions write the answer the way the Lab's experiments do (`toys.training_experiments.verdict`):

- `curve_sentence(summary, metric)`: one text's pruning curve (`analysis.pruning.Curve.summary()`:
  `<metric>_mean`, `<metric>_std` per order and fraction): importance order against random orders at
  `MARK` of the heads removed.
- `corpus_curve_sentence(summary, metric)`: the same over a corpus (`corpus_runs` summary: value,
  ci_low, ci_high per order "importance", "random 1", …, fraction, metric).
(The corpus run that halves each layer's heads is said by `latency.latency_answers.halved_sentence`: its
cost in the metric beside the Pi latency it saves.)
- `mask_sentence(...)` and `image_mask_sentence(effect, heads_off, heads)`: what the applied mask did to
  one text's or one photo's output.
No Streamlit here; every function returns a str (or None when the numbers to say it are missing).
"""
from __future__ import annotations


import pandas as pd

from attnviz.base.numbers import interval, number

MARK = 0.3          # the founding claim: "pruned 30 % of the heads and accuracy barely dropped"
LOWER_IS_BETTER = ("perplexity", "kl", "wer", "loss")
NAMES = {"top1": "top-1 agreement", "cosine": "embedding cosine", "nn_agreement": "nearest-neighbour agreement",
         "perplexity": "perplexity", "kl": "KL divergence", "chrf": "chrF", "wer": "word error rate"}


def metric_name(metric: str) -> str:
    return NAMES.get(metric, metric.replace("_", " "))


def lower_is_better(metric: str) -> bool:
    return metric.startswith(LOWER_IS_BETTER)


def nearest(fractions, wanted: float) -> float:
    return min(fractions, key=lambda f: abs(f - wanted))


def _compare(metric: str, ours: float, theirs: float) -> str:
    better = ours < theirs if lower_is_better(metric) else ours > theirs
    if round(ours - theirs, 3) == 0:
        return "the order makes no difference there"
    return "importance order does better" if better else "random order does better (importance did not help here)"


def curve_sentence(summary: pd.DataFrame, metric: str, n_heads: int, mark: float = MARK) -> str | None:
    """One text's pruning curve at `mark` of the heads removed: importance against random order."""
    col = f"{metric}_mean"
    if summary is None or summary.empty or col not in summary.columns:
        return None
    orders = set(summary["order"])
    if "importance" not in orders:
        return None
    steps = sorted(f for f in set(summary.loc[summary["order"] == "importance", "fraction"]) if f > 0)
    if not steps:   # a run stopped before its first step: nothing removed yet, nothing to say
        return None
    at = nearest(steps, mark)
    imp = summary[(summary["order"] == "importance") & (summary["fraction"] == at)].iloc[0]
    removed = round(at * n_heads)
    text = (f"Removing {at:.0%} of the heads ({removed} of {n_heads}) by importance "
            f"{'gives' if lower_is_better(metric) else 'keeps'} {metric_name(metric)} at {number(imp[col])}")
    rand = summary[(summary["order"] == "random") & (summary["fraction"] == at)]
    if rand.empty:
        return text + " (no random order at this step yet)."
    r = rand.iloc[0]
    spread = f" ± {number(r[f'{metric}_std'])}" if int(r.get("runs", 1)) > 1 else ""
    return (text + f" against {number(r[col])}{spread} in random order (mean{' ± sd' if spread else ''} over "
            f"{int(r.get('runs', 1))} order{'s' if int(r.get('runs', 1)) != 1 else ''}): "
            f"{_compare(metric, imp[col], r[col])}.")


def corpus_curve_sentence(summary: pd.DataFrame, metric: str, n_heads: int, n_items: int,
                          mark: float = MARK) -> str | None:
    """A corpus pruning curve at `mark`: importance order's mean and 95 % interval against the random
    orders' mean (and the range of their intervals)."""
    if summary is None or summary.empty or "order" not in summary.columns:
        return None
    rows = summary[summary["metric"] == metric]
    imp_rows = rows[rows["order"] == "importance"]
    if imp_rows.empty:
        return None
    steps = sorted(f for f in set(imp_rows["fraction"]) if f > 0)
    if not steps:
        return None
    at = nearest(steps, mark)
    imp = imp_rows[imp_rows["fraction"] == at].iloc[0]
    kept = int(imp["heads_kept"]) if "heads_kept" in imp else round((1 - at) * n_heads)
    text = (f"Over {n_items} items, removing {at:.0%} of the heads ({n_heads - kept} of {n_heads}) by importance "
            f"{'gives' if lower_is_better(metric) else 'keeps'} {metric_name(metric)} at {number(imp['value'])}"
            f"{interval(imp['ci_low'], imp['ci_high'])}")
    rand = rows[rows["order"].astype(str).str.startswith("random") & (rows["fraction"] == at)]
    if rand.empty:
        return text + " (no random order at this step yet)."
    mean = float(rand["value"].mean())
    band = (f" [their 95 % CIs span {number(rand['ci_low'].min())}–{number(rand['ci_high'].max())}]"
            if rand["ci_low"].notna().all() else "")
    return (text + f" against {number(mean)} in random order (mean of {len(rand)} order"
            f"{'s' if len(rand) != 1 else ''}){band}: {_compare(metric, imp['value'], mean)}.")


def mask_sentence(heads_off: int, heads: int, metric: str, value: float, full: float, flips: int | None = None,
                  positions: int | None = None) -> str:
    """One text under the applied mask: the metric against the full model's."""
    if heads_off == 0:
        return f"Every head is on: {metric_name(metric)} is the full model's ({number(full, 4)})."
    if round(value - full, 4) == 0:
        said = f"{metric_name(metric)} stays {number(value, 4)} (= full)"
    else:
        said = f"{metric_name(metric)} is {number(value, 4)} against the full model's {number(full, 4)}"
    text = f"With {heads_off} of {heads} heads off, {said}"
    if flips is not None and positions:
        text += f", and {flips} of {positions} next-token predictions change" if flips else \
            ", and no next-token prediction changes"
    return text + "."


def image_mask_sentence(cls_cosine: float, saliency_iou: float | None, saliency_change: float | None,
                        heads_off: int, heads: int) -> str:
    """One photo under the applied mask: what stays of the CLS embedding and of the saliency map."""
    text = f"With {heads_off} of {heads} heads off, the CLS embedding keeps cosine {cls_cosine:.4f} to the full model's"
    if round(cls_cosine - 1, 4) == 0:
        text = f"With {heads_off} of {heads} heads off, the CLS embedding is unchanged (cosine 1.0000, = full)"
    if saliency_iou is not None:
        text += (f"; the saliency map above 0.5 overlaps the full model's at IoU {saliency_iou:.3f}, each patch "
                 f"moving by {saliency_change:.4f} on average (of 1)")
    verdict = "these heads matter little for this photo" if cls_cosine >= 0.99 and (saliency_iou is None or
                                                                                    saliency_iou >= 0.9) \
        else "these heads change what the model sees in this photo"
    return text + f": {verdict}."
