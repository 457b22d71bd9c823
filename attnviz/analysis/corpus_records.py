"""Checks of a results file's records before a resumed run counts them.

A results file sits on disk between two runs, so what it holds is input like any upload: a record
is used only if its item exists in the run (its index within the header's item count), it has
every field its phase writes, its arrays have the shapes and numeric dtypes of this model, and
its metrics are the ones `corpus_metrics.compare` computes from the outputs stored beside them,
within each metric's range. Anything else is skipped (that item simply runs again) and counted.
Nothing in a record can make the reader allocate more than the line's own size a few times over:
`corpus_engine` decodes arrays only into the numeric dtypes of its `ARRAY_DTYPES`.
"""
from __future__ import annotations

import math

import numpy as np

from attnviz.analysis import corpus_metrics

INF = math.inf
# The range of every per-item figure `corpus_metrics.compare` writes (NaN is allowed: a cosine of a
# zero vector, a score of an empty output); a stored value outside it was not computed by a run.
RANGES = {"top1": (0.0, 1.0), "kl": (0.0, INF), "tokens": (0.0, INF), "nll_full": (0.0, INF),
          "nll_pruned": (0.0, INF), "perplexity_full": (1.0, INF), "perplexity_pruned": (1.0, INF),
          "cosine": (-1.0, 1.0), "cls_cosine": (-1.0, 1.0), "saliency_iou": (0.0, 1.0),
          "chrf": (0.0, 1.0), "exact_match": (0.0, 1.0), "chrf_native": (0.0, 1.0),
          "exact_match_native": (0.0, 1.0), "full_matches_native": (0.0, 1.0),
          "wer": (0.0, INF), "word_accuracy": (-INF, 1.0), "score_full": (-INF, INF), "score_pruned": (-INF, INF)}
SLACK = 1e-6                  # float rounding at a range's ends (a cosine of 1.0000001)


class BadRecord(ValueError):
    """A record that does not fit its run."""


def _need(ok: bool, why: str):
    if not ok:
        raise BadRecord(why)


def _number(value, low=-INF, high=INF, nan=True) -> float:
    _need(isinstance(value, (int, float)) and not isinstance(value, bool), "not a number")
    value = float(value)
    if math.isnan(value):
        _need(nan, "NaN")
        return value
    _need(low - SLACK <= value <= high + SLACK, f"{value} outside [{low}, {high}]")
    return value


def _array(value, ndim: int, shape=None, kind: str = "f", finite: bool = True) -> np.ndarray:
    _need(isinstance(value, np.ndarray) and value.ndim == ndim, "not an array of the right rank")
    _need(value.dtype.kind in kind, f"dtype {value.dtype}")
    if shape is not None:
        _need(tuple(value.shape) == tuple(shape), f"shape {value.shape}, not {shape}")
    if finite and value.dtype.kind == "f":
        _need(bool(np.isfinite(value).all()), "not finite")
    return value


def _output(kind: str, out, d_model: int) -> dict:
    """One `corpus_metrics.output` dict of a model of `kind`, checked field by field."""
    _need(isinstance(out, dict) and out.get("kind") == kind, "not an output of this model kind")
    _number(out.get("score"))
    if kind == "lm":
        ids = _array(out.get("top_ids"), 2, kind="iu")
        _array(out.get("top_logprobs"), 2, shape=ids.shape)
        _need(bool((out["top_logprobs"] <= SLACK).all()), "a log-probability above 0")
        nll = _array(out.get("nll"), 1)
        _need(len(nll) == max(len(ids) - 1, 0) and bool((nll >= -SLACK).all()), "negative log-likelihoods")
    elif kind == "encoder":
        _array(out.get("embedding"), 1, shape=(d_model,))
        if "pair" in out:
            _array(out["pair"], 1, shape=(d_model,))
    elif kind in ("translator", "speech"):
        _need(isinstance(out.get("text"), str), "no text")
        if "native" in out:
            _need(isinstance(out["native"], str), "no native text")
    else:
        _array(out.get("cls"), 1, shape=(d_model,))
        if "salient" in out:
            _array(out["salient"], 2, kind="b")
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b or abs(a - b) <= 1e-9 * max(1.0, abs(a))


def scored(result, kind: str, codes, d_model: int) -> dict:
    """A `masks_task` record: the full output, one step per mask code of this run, each step's
    metrics in range and equal to what `compare` gives for the outputs stored beside them."""
    _need(isinstance(result, dict), "not a table")
    full = _output(kind, result.get("full"), d_model)
    steps = result.get("steps")
    _need(isinstance(steps, dict) and set(steps) == set(codes), "not the steps of this run")
    for code in codes:
        step = steps[code]
        _need(isinstance(step, dict) and isinstance(step.get("metrics"), dict), "a step without metrics")
        pruned = _output(kind, step.get("pruned"), d_model)
        try:
            again = corpus_metrics.compare(kind, full, pruned)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
            raise BadRecord(f"its outputs cannot be compared ({err})") from None
        stored = step["metrics"]
        _need(set(stored) == set(again), "not the metrics of this model kind")
        for name, value in stored.items():
            low, high = RANGES.get(name, (-INF, INF))
            _need(_same(_number(value, low, high), float(again[name])), f"{name} is not its outputs' figure")
    tokens = result.get("tokens")
    _need(tokens is None or (isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0), "tokens")
    return result


def importance(result, gradient: bool, n_layers: int, n_heads: int) -> dict:
    """An `importance_task` / `ablation_task` record: [L, H] finite raw importance (a gradient's is
    never negative; a head's drop of a metric is at least minus that metric's range)."""
    _need(isinstance(result, dict), "not a table")
    raw = _array(result.get("raw"), 2, shape=(n_layers, n_heads))
    _need(bool((raw >= (-SLACK if gradient else -2.0 - SLACK)).all()), "importance out of range")
    tokens = result.get("tokens")
    _need(tokens is None or (isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0), "tokens")
    return result
