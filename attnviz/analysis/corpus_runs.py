"""Runs over a corpus: head importance accumulated over it, the pruning curve over it, "4 vs 8
heads" and any head mask scored over it. Every run is per-item work on the one engine
(`corpus_engine.run_tasks`: in-process, a local cluster or a remote one) and gives the same figures
everywhere: the same items, and each item's seed taken from its index, never from the worker.

- importance: Michel et al. (2019) gradient importance (`importance.gradient_importance`) of each
  item, averaged over the corpus, then normalised per layer as `importance` does. Translators,
  speech and vision models, which that gradient does not reach, get single-head ablation instead:
  the drop of the item's primary metric with each head alone off (one forward per head and item).
- pruning_curve: importance first, then heads removed least important first at each fraction of
  `FRACTIONS`, beside `RANDOM_ORDERS` seeded random orders; `extra["mark"]` is the 30 % point.
- heads_4_vs_8: importance first, then every layer keeps its more important half; `extra["keep"]`
  (kept heads per layer) is what the latency layer prices on a Raspberry Pi 4 / 5.
- mask: a head mask (the editor's format, `pruning.encode_mask`) scored over the corpus.

Metrics per item are `corpus_metrics.compare` of the masked model's output against the full one's;
`corpus_metrics.summarise` aggregates them, with confidence intervals, over the items finished.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnviz.analysis import corpus_metrics, corpus_records, importance
from attnviz.analysis.corpus import Corpus, ready_item
from attnviz.analysis.corpus_engine import ResultsFile, session, worker_model, worker_native
from attnviz.analysis.pruning import decode_mask, encode_mask
from attnviz.base.names import head_name

RUN_KINDS = {
    "importance": "head importance (Michel et al. gradients) accumulated over the corpus",
    "pruning_curve": "the corpus metric as heads are removed in importance order and in random orders",
    "heads_4_vs_8": "each layer's heads halved by importance: the corpus metric beside the Pi latency",
    "mask": "one head mask (the editor's) scored over the corpus",
}
FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)   # of the heads removed, for the curve
RANDOM_ORDERS = 3
MARK = 0.3                  # the founding claim: "pruned 30 % of the heads and accuracy barely dropped"
ITEM_TOKENS = 128           # an item's importance is taken over its first 128 tokens (one window)
Z95 = 1.959963984540054     # normal 95 % interval of a mean over the items
GRADIENT_KINDS = ("lm", "encoder")


@dataclass
class RunResult:
    kind: str
    model_key: str
    corpus_key: str
    table: pd.DataFrame         # one row per (item, step) with the metrics
    summary: pd.DataFrame       # aggregated, with ci_low / ci_high
    complete: bool
    done: int
    total: int
    extra: dict = field(default_factory=dict)


def item_seed(seed: int, index: int) -> int:
    """An item's own seed: the same whichever process runs it."""
    return int(seed) * 1_000_003 + int(index)


# ---------------------------------------------------------------- per-item tasks (run on workers)
def facts_task(model_key: str, params: dict, index: int, item) -> dict:
    model = worker_model(model_key)
    return dict(kind=corpus_metrics.model_kind(model), mask_layers=int(model.mask_layers),
                n_heads=int(model.cfg.n_heads), cfg=model.cfg)


def importance_task(model_key: str, params: dict, index: int, item) -> dict:
    model = worker_model(model_key)
    data = importance.eval_windows(model, item, max_tokens=ITEM_TOKENS, window=ITEM_TOKENS)
    imp = importance.gradient_importance(model, data, seed=item_seed(params["seed"], index))
    return dict(raw=imp.raw.numpy().astype(np.float64), tokens=int(data.ids.shape[1]))


def ablation_task(model_key: str, params: dict, index: int, item) -> dict:
    """Importance without gradients (translators, speech, vision): per head, how much the item's
    primary metric drops when that head alone is off (the full model scores itself as the top)."""
    model, item = worker_model(model_key), ready_item(item)   # an uploaded file is decoded here, now
    kind = corpus_metrics.model_kind(model)
    metric = corpus_metrics.PRIMARY[kind]
    L, H = int(model.mask_layers), int(model.cfg.n_heads)
    full = corpus_metrics.output(model, item)
    top = corpus_metrics.compare(kind, full, full)[metric]
    raw = np.zeros((L, H))
    for i in range(L):
        for h in range(H):
            mask = torch.ones(L, H)
            mask[i, h] = 0
            raw[i, h] = top - corpus_metrics.compare(kind, full, corpus_metrics.output(model, item, head_mask=mask))[metric]
    return dict(raw=raw, tokens=None)


def masks_task(model_key: str, params: dict, index: int, item) -> dict:
    """The full output and, per mask code, the masked output and its metrics against the full."""
    model, item = worker_model(model_key), ready_item(item)
    kind = corpus_metrics.model_kind(model)
    L, H = int(model.mask_layers), int(model.cfg.n_heads)
    full = corpus_metrics.output(model, item)
    if params.get("reference", "full") != "full":
        full["native"] = worker_native(model_key).translate(str(item))
    steps = {}
    for code in params["codes"]:
        mask = decode_mask(code, L, H).float()
        pruned = corpus_metrics.output(model, item, head_mask=mask)
        steps[code] = dict(metrics=corpus_metrics.compare(kind, full, pruned), pruned=pruned)
    tokenizer = getattr(model, "tokenizer", None)
    tokens = len(tokenizer(item)["input_ids"]) if isinstance(item, str) and tokenizer is not None else None
    return dict(full=full, steps=steps, tokens=tokens)


# ---------------------------------------------------------------- orders and masks
def ranked_keep(scores: torch.Tensor, fraction_removed: float) -> torch.Tensor:
    """BoolTensor [L, H]: heads kept once `fraction_removed` of them go, lowest score first."""
    return importance.keep_top(scores, 1.0 - fraction_removed)


def random_scores(shape, seed: int, order: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(int(seed) * 7919 + 1 + order)
    return torch.randperm(shape[0] * shape[1], generator=gen).float().view(*shape)


def halved_keep(scores: torch.Tensor) -> torch.Tensor:
    """Each layer keeps its more important half of the heads (at least one)."""
    L, H = scores.shape
    keep = torch.zeros(L, H, dtype=torch.bool)
    for i in range(L):
        keep[i, torch.argsort(scores[i], descending=True, stable=True)[:max(1, H // 2)]] = True
    return keep


def curve_steps(scores: torch.Tensor, seed: int, orders: int, fractions) -> list[dict]:
    steps = []
    for f in fractions:
        steps.append(dict(order="importance", fraction=float(f), code=encode_mask(ranked_keep(scores, f))))
        for r in range(orders):
            keep = ranked_keep(random_scores(scores.shape, seed, r), f)
            steps.append(dict(order=f"random {r + 1}", fraction=float(f), code=encode_mask(keep)))
    return steps


def kept_heads(code: str, L: int, H: int) -> int:
    return int(decode_mask(code, L, H).sum())


# ---------------------------------------------------------------- aggregation
def importance_summary(raws: dict[int, np.ndarray]) -> tuple[pd.DataFrame, torch.Tensor]:
    """Per head: the corpus mean of the raw importance normalised per layer (Michel et al.), with a
    95 % interval of that mean over the items, normalised by the same per-layer norm."""
    stack = np.stack([raws[i] for i in sorted(raws)])                # (n, L, H)
    n = stack.shape[0]
    mean = stack.mean(0)
    scores = importance.normalise_per_layer(torch.from_numpy(mean))
    norm = np.linalg.norm(np.nan_to_num(mean), axis=1, keepdims=True).clip(1e-20)
    half = Z95 * (stack.std(0, ddof=1) / np.sqrt(n) if n > 1 else np.full_like(mean, np.nan)) / norm
    L, H = mean.shape
    rows = [dict(metric=head_name(i, h), layer=i, head=h, value=float(scores[i, h]), raw=float(mean[i, h]),
                 ci_low=float(scores[i, h] - half[i, h]), ci_high=float(scores[i, h] + half[i, h]), n=n)
            for i in range(L) for h in range(H)]
    return pd.DataFrame(rows).sort_values("value", ascending=False, kind="stable").reset_index(drop=True), scores


def steps_table(results: dict[int, dict], steps: list[dict], L: int, H: int) -> pd.DataFrame:
    rows = []
    for index in sorted(results):
        for step in steps:
            metrics = results[index]["steps"][step["code"]]["metrics"]
            rows.append(dict(item=index, order=step["order"], fraction=step["fraction"],
                             heads_kept=kept_heads(step["code"], L, H), **metrics))
    return pd.DataFrame(rows)


def steps_summary(kind: str, results: dict[int, dict], steps: list[dict], labels, seed: int,
                  L: int, H: int, reference: str = "full") -> pd.DataFrame:
    done = sorted(results)
    if not done:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    item_labels = None if labels is None else [labels[i] for i in done]
    fulls = [results[i]["full"] for i in done]
    parts = []
    for step in steps:
        per = [results[i]["steps"][step["code"]] for i in done]
        rows = pd.DataFrame([p["metrics"] for p in per])
        part = corpus_metrics.summarise(kind, rows, fulls, [p["pruned"] for p in per], item_labels, seed,
                                        reference)
        part.insert(0, "heads_kept", kept_heads(step["code"], L, H))
        part.insert(0, "fraction", step["fraction"])
        part.insert(0, "order", step["order"])
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


SUMMARY_COLUMNS = ["order", "fraction", "heads_kept", "metric", "value", "ci_low", "ci_high", "n"]


def running_summary(table: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """While a run goes: per step, each per-item metric of `names` over the items done so far, its
    mean with a normal 95 % interval (NaN below two items). Cheap enough to redo after every item;
    the final summary's bootstrap and corpus-level figures (pooled perplexity, corpus chrF,
    nearest neighbours) come from `steps_summary` at the end."""
    cols = [m for m in names if m in table.columns and not m.startswith("perplexity")]
    rows = []
    if len(table) and cols:
        for (order, fraction, kept), part in table.groupby(["order", "fraction", "heads_kept"], sort=False):
            for m in cols:
                v = part[m].to_numpy(dtype=float)
                v = v[np.isfinite(v)]
                if not len(v):
                    continue
                mean = float(v.mean())
                half = Z95 * float(v.std(ddof=1)) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
                rows.append(dict(order=order, fraction=fraction, heads_kept=kept, metric=m, value=mean,
                                 ci_low=mean - half, ci_high=mean + half, n=len(v)))
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def curve_points(summary: pd.DataFrame, metric: str) -> list[dict]:
    chosen = summary[summary["metric"] == metric]
    return [dict(order=r.order, fraction=float(r.fraction), value=float(r.value), ci_low=float(r.ci_low),
                 ci_high=float(r.ci_high)) for r in chosen.itertuples()]


# ---------------------------------------------------------------- the run
class _Phases:
    """Runs the phases of one corpus run, recording each finished item (and in the results file)."""

    def __init__(self, model_key, corpus, engine, progress, should_stop, resume, header, phases, store=None):
        self.model_key, self.corpus, self.engine = model_key, corpus, engine
        self.progress, self.should_stop = progress, should_stop
        self.file = ResultsFile(resume, header, store) if resume is not None else None
        self.total = phases * len(corpus.items)
        self.done = 0
        self.stopped, self.fault = False, ""    # fault: what the cluster did when it ended the run
        self.workers: dict[str, int] = {}
        self.partial = None     # (phase, results) -> a partial RunResult for progress

    def run(self, phase: str, fn, params: dict, check=None) -> dict[int, dict]:
        """The file's records that `check` accepts (BadRecord: the item runs again), then the other items."""
        results = {}
        if self.file is not None:
            for (p, i), r in self.file.records.items():
                if p != phase or i >= len(self.corpus.items):
                    continue
                try:
                    results[i] = r if check is None else check(r)
                except corpus_records.BadRecord:
                    self.file.skipped += 1
            self.done += len(results)
        todo = [(i, item) for i, item in enumerate(self.corpus.items) if i not in results]
        if self.stopped:
            return results

        def on_result(index, value):
            results[index] = value
            if self.file is not None:
                self.file.add(phase, index, value)
            self.done += 1
            if self.progress is not None:
                self.progress(self.done, self.total, self.partial(phase, results) if self.partial else None)

        out = self.engine.map(fn, (self.model_key, params), todo, on_result=on_result,
                              should_stop=self.should_stop, name=phase)
        for where, n in (out.workers or {}).items():
            self.workers[where] = self.workers.get(where, 0) + n
        self.stopped, self.fault = out.stopped is not None, out.message or self.fault
        return results


    def notes(self) -> dict:
        """`resume_note`: what of the results file was not used; `stopped_note`: why the cluster ended the run."""
        out, skipped = {}, self.file.skipped if self.file is not None else 0
        if skipped:
            out["resume_note"] = (f"skipped {skipped} record{'s' * (skipped > 1)} of the results file that do not "
                                  "fit this run (an item it does not have, a field missing, a figure out of range "
                                  "or not its outputs'): those items run again")
        if self.fault:
            kept = " in the results file: run again with the same options to finish" if self.file else ""
            out["stopped_note"] = f"{self.fault}; the {self.done} finished steps are kept{kept}"
        return out


def _facts(model_key: str, engine) -> dict:
    got = {}
    out = engine.map(facts_task, (model_key, {}), [(0, None)], on_result=lambda i, v: got.update(v), name="facts")
    if out.stopped:
        raise ValueError(f"{out.message or 'the run was stopped'} before its first step; nothing was run")
    return got


def run(model_key: str, corpus: Corpus, kind: str, *, mask=None, metric: str | None = None,
        scheduler: str | None = None, seed: int = 0, progress=None, should_stop=None,
        resume: str | Path | None = None, random_orders: int = RANDOM_ORDERS,
        fractions=FRACTIONS, reference: str = "full", results_store=None) -> RunResult:
    """One corpus run (see the module docstring). `mask`: an encoded mask ("LxH-hex") or a
    [L, H] bool/float array, for kind "mask". `metric`: what the curve follows (default
    corpus_metrics.PRIMARY for the model's kind). `progress(done, total, partial RunResult)`;
    `should_stop()` ends the run early with what finished (complete=False); `resume`: a results
    file written as items finish, whose finished items a rerun with the same options skips
    (`results_store`: the `corpus_engine.ResultsStore` that bounds it). `reference`
    (translators): score the pruned output against the full model ("full"), the package's native
    engine ("native") or both; importance by ablation always follows the full model."""
    if kind not in RUN_KINDS:
        raise ValueError(f"unknown run kind {kind!r}; choose one of {', '.join(RUN_KINDS)}")
    if not corpus.items:
        raise ValueError(f"the corpus {corpus.key!r} has no items")
    with session(scheduler) as engine:
        return _run(engine, model_key, corpus, kind, mask, metric, seed, progress, should_stop, resume,
                    random_orders, fractions, reference, results_store)


def _run(engine, model_key, corpus, kind, mask, metric, seed, progress, should_stop, resume,
         random_orders, fractions, reference, store) -> RunResult:
    facts = _facts(model_key, engine)
    mkind, L, H = facts["kind"], facts["mask_layers"], facts["n_heads"]
    corpus_metrics.check_reference(mkind, reference)
    metric = metric or corpus_metrics.primary(mkind, reference)
    code = None
    if kind == "mask":
        if mask is None:
            raise ValueError("a mask run needs a head mask (e.g. --mask 6x12-fff... from the head editor)")
        code = mask if isinstance(mask, str) else encode_mask(torch.as_tensor(mask) > 0.5)
        code = encode_mask(decode_mask(code, L, H))      # checked against the model, one spelling
    header = dict(model=model_key, corpus=corpus.key, items=len(corpus.items), kind=kind, seed=int(seed),
                  mask=code, random_orders=int(random_orders), fractions=[float(f) for f in fractions],
                  reference=reference)
    phases = _Phases(model_key, corpus, engine, progress, should_stop, resume, header,
                     1 if kind in ("importance", "mask") else 2, store)
    extra = dict(model_kind=mkind, metric=metric, cfg=facts["cfg"], n_layers=L, n_heads=H, reference=reference)
    if kind == "mask":
        return _scored(phases, kind, [dict(order="mask", fraction=1 - kept_heads(code, L, H) / (L * H),
                                           code=code)], mkind, L, H, seed, extra)

    def partial_importance(phase, results):
        return _importance_result(phases, kind, results, extra, complete=False)

    phases.partial = partial_importance
    gradient = mkind in GRADIENT_KINDS
    extra["importance_method"] = ("gradient (Michel et al.)" if gradient else
                                  f"single-head ablation: the drop of {corpus_metrics.PRIMARY[mkind]}")
    raws = phases.run("importance", importance_task if gradient else ablation_task, dict(seed=int(seed)),
                      lambda r: corpus_records.importance(r, gradient, L, H))
    result = _importance_result(phases, kind, raws, extra, complete=not phases.stopped)
    if kind == "importance" or phases.stopped or not raws:
        return result
    scores = torch.as_tensor(np.asarray(result.extra["importance"]))
    extra["importance"] = result.extra["importance"]
    extra["importance_items"] = len(raws)
    if kind == "pruning_curve":
        steps = curve_steps(scores, seed, int(random_orders), fractions)
        extra["mark"] = MARK
    else:
        keep = halved_keep(scores)
        steps = [dict(order="halved", fraction=1 - int(keep.sum()) / (L * H), code=encode_mask(keep))]
        extra["keep"] = keep.tolist()
        extra["kept_per_layer"] = keep.sum(1).tolist()
    return _scored(phases, kind, steps, mkind, L, H, seed, extra)


def _importance_result(phases: _Phases, kind, raws, extra, complete: bool) -> RunResult:
    done = sorted(raws)
    table = pd.DataFrame([dict(item=i, tokens=raws[i]["tokens"]) for i in done])
    summary, out = pd.DataFrame(), dict(extra)
    if done:
        summary, scores = importance_summary({i: raws[i]["raw"] for i in done})
        out["importance"] = scores.tolist()
    out.update(workers=dict(phases.workers), **phases.notes())
    return RunResult(kind, phases.model_key, phases.corpus.key, table, summary, complete, phases.done,
                     phases.total, out)


def _scored(phases: _Phases, kind, steps, mkind, L, H, seed, extra) -> RunResult:
    codes = sorted({s["code"] for s in steps})

    names = corpus_metrics.metric_names(mkind, extra["reference"])

    def partial(phase, results):
        table = steps_table(results, steps, L, H)
        return RunResult(kind, phases.model_key, phases.corpus.key, table, running_summary(table, names), False,
                         phases.done, phases.total, dict(extra, running=len(results), steps=steps))

    phases.partial = partial
    d_model = int(extra["cfg"].d_model)
    results = phases.run("scored", masks_task, dict(codes=codes, reference=extra["reference"]),
                         lambda r: corpus_records.scored(r, mkind, codes, d_model))
    summary = steps_summary(mkind, results, steps, phases.corpus.labels, seed, L, H, extra["reference"])
    out = dict(extra, workers=dict(phases.workers), steps=steps, **phases.notes())
    tokens = [r["tokens"] for r in results.values() if r.get("tokens")]
    out["tokens"] = int(round(float(np.mean(tokens)))) if tokens else None
    if kind == "pruning_curve":
        out["curve"] = curve_points(summary, extra["metric"])
    if not summary.empty and extra["metric"] not in set(summary["metric"]):
        raise ValueError(f"the metric {extra['metric']!r} is not one this model's runs give; choose one of "
                         f"{', '.join(sorted(set(summary['metric'])))}")
    return RunResult(kind, phases.model_key, phases.corpus.key, steps_table(results, steps, L, H), summary,
                     not phases.stopped and len(results) == len(phases.corpus.items), phases.done,
                     phases.total, out)
