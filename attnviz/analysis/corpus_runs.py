"""Runs over a corpus: head importance accumulated over it, the pruning curve over it, "4 vs 8
heads" and any head mask scored over it. Every run is per-item work, sent in batches of items
(`corpus_tasks.batch_task`), on the one engine (`corpus_engine`: in-process, a local cluster or a
remote one) and gives the same figures everywhere: the same items in the same batches, and each
item's seed taken from its index, never from the worker. A budget is checked before each batch
and the run's estimate updated after it (`corpus_plan`).

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

from attnviz.analysis import corpus_metrics, corpus_plan, corpus_records, importance
from attnviz.analysis.corpus import Corpus
from attnviz.analysis.corpus_engine import ResultsFile, session, worker_model, worker_native  # noqa: F401
from attnviz.analysis.corpus_tasks import (  # noqa: F401  (the tasks' names, importable from here)
    GRADIENT_KINDS, ITEM_TOKENS, ablation_task, batch_task, facts_task, importance_task, item_seed, item_tokens,
    masks_task)
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
Z95 = 1.959963984540054     # normal 95 % interval of a mean over the items


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
    """Runs the phases of one corpus run a batch at a time (`corpus_tasks.batch_task`), recording
    each finished item (and in the results file), and keeps its budget and estimate (`corpus_plan`)."""

    def __init__(self, model_key, corpus, engine, progress, should_stop, resume, header, phases, store=None,
                 budget=None, per_task=corpus_plan.TEXTS_PER_TASK):
        self.model_key, self.corpus, self.engine = model_key, corpus, engine
        self.progress, self.should_stop = progress, should_stop
        self.file = ResultsFile(resume, header, store) if resume is not None else None
        self.total = phases * len(corpus.items)
        self.done = 0
        self.stopped, self.fault = False, ""    # fault: what the cluster did when it ended the run
        self.workers: dict[str, int] = {}
        self.partial = None     # (phase, results) -> a partial RunResult for progress
        self.budget = budget or corpus_plan.Budget(None)
        self.plan, self.tokens, self.per_task = corpus_plan.Plan(), None, per_task

    def estimate(self) -> dict:
        return self.budget.estimate(self.plan)

    def run(self, phase: str, params: dict, check=None) -> dict[int, dict]:
        """The file's records that `check` accepts (BadRecord: the item runs again), then the other
        items, a batch at a time; a batch starts only while the budget allows it."""
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
        chunks = corpus_plan.batches(todo, self.tokens, corpus_plan.texts_per_task(params, self.per_task))
        left = {first: self.plan.of(phase, [i for i, _ in chunk]) for first, chunk in chunks}
        # the dearest batches first (Dask runs them in the order submitted): the last to finish are
        # the cheapest, so no worker waits long on another's long batch at the end of a phase
        chunks.sort(key=lambda c: (-left[c[0]], c[0]))

        def on_result(first, values):
            self.budget.finished(left.pop(first, 0.0))
            for index in sorted(values):
                results[index] = values[index]
                if self.file is not None:
                    self.file.add(phase, index, values[index])
                self.done += 1
                if self.progress is not None:
                    partial = self.partial(phase, results) if self.partial else None
                    if partial is not None:
                        partial.extra["estimate"] = self.estimate()
                    self.progress(self.done, self.total, partial)

        def stop():
            if self.should_stop is not None and self.should_stop():
                return True
            return self.budget.exhausted(sum(left.values()) / len(left) if left else 0.0)

        self.budget.begin(phase)
        out = self.engine.map(batch_task, (self.model_key, dict(params, phase=phase)), chunks,
                              on_result=on_result, should_stop=stop, name=phase, size=len)
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


def _facts(model_key: str, engine, corpus: Corpus) -> dict:
    got, texts = {}, list(corpus.items) if corpus.kind == "text" else []
    out = engine.map(facts_task, (model_key, dict(texts=texts)), [(0, None)], on_result=lambda i, v: got.update(v),
                     name="facts")
    if out.stopped:
        raise ValueError(f"{out.message or 'the run was stopped'} before its first step; nothing was run")
    return got


def run(model_key: str, corpus: Corpus, kind: str, *, mask=None, metric: str | None = None,
        scheduler: str | None = None, seed: int = 0, progress=None, should_stop=None,
        resume: str | Path | None = None, random_orders: int = RANDOM_ORDERS,
        fractions=FRACTIONS, reference: str = "full", results_store=None, budget: float | None = None,
        clock=None, per_task: int = corpus_plan.TEXTS_PER_TASK, engine=None) -> RunResult:
    """One corpus run (see the module docstring). `mask`: an encoded mask ("LxH-hex") or a
    [L, H] bool/float array, for kind "mask". `metric`: what the curve follows (default
    corpus_metrics.PRIMARY for the model's kind). `progress(done, total, partial RunResult)`;
    `should_stop()` ends the run early with what finished (complete=False); `resume`: a results
    file written as items finish, whose finished items a rerun with the same options skips
    (`results_store`: the `corpus_engine.ResultsStore` that bounds it). `reference`
    (translators): score the pruned output against the full model ("full"), the package's native
    engine ("native") or both; importance by ablation always follows the full model. `budget`:
    seconds the run may take (checked before each batch of `per_task` items starts, on `clock`,
    see `corpus_plan.Budget`); `extra["estimate"]` says what it measured and what is left.
    `engine`: a `corpus_engine.Engine` already open (its workers warm), instead of `scheduler`'s own."""
    if kind not in RUN_KINDS:
        raise ValueError(f"unknown run kind {kind!r}; choose one of {', '.join(RUN_KINDS)}")
    if not corpus.items:
        raise ValueError(f"the corpus {corpus.key!r} has no items")
    timer = corpus_plan.Budget(budget, clock) if clock is not None else corpus_plan.Budget(budget)
    if engine is not None:
        return _run(engine, model_key, corpus, kind, mask, metric, seed, progress, should_stop, resume,
                    random_orders, fractions, reference, results_store, timer, per_task)
    with session(scheduler) as engine:
        return _run(engine, model_key, corpus, kind, mask, metric, seed, progress, should_stop, resume,
                    random_orders, fractions, reference, results_store, timer, per_task)


def plan_for(model, corpus: Corpus, kind: str, *, random_orders: int = RANDOM_ORDERS,
             fractions=FRACTIONS, tokens: list[int] | None = None) -> corpus_plan.Plan:
    """The forward-tokens a run will make (`corpus_plan.plan`), before its importance is known
    (every curve mask counted as distinct). `model`: the loaded model, or its facts (`facts_task`)."""
    facts = model if isinstance(model, dict) else dict(
        kind=corpus_metrics.model_kind(model), mask_layers=int(model.mask_layers), n_heads=int(model.cfg.n_heads),
        tokens=tokens if tokens is not None else item_tokens(model, corpus.items) if corpus.kind == "text" else None)
    return corpus_plan.plan(kind, facts["kind"], facts.get("tokens"), len(corpus.items),
                            masks=corpus_plan.distinct_masks(kind, fractions, random_orders),
                            cells=facts["mask_layers"] * facts["n_heads"], probes=importance.GRAD_PROBES)


def _run(engine, model_key, corpus, kind, mask, metric, seed, progress, should_stop, resume,
         random_orders, fractions, reference, store, budget, per_task) -> RunResult:
    facts = _facts(model_key, engine, corpus)
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
                     1 if kind in ("importance", "mask") else 2, store, budget, per_task)
    phases.tokens = facts.get("tokens")
    phases.plan = plan_for(facts, corpus, kind, random_orders=random_orders, fractions=fractions)
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
    raws = phases.run("importance", dict(seed=int(seed)),
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
    out.update(workers=dict(phases.workers), estimate=phases.estimate(), **phases.notes())
    return RunResult(kind, phases.model_key, phases.corpus.key, table, summary, complete, phases.done,
                     phases.total, out)


def _scored(phases: _Phases, kind, steps, mkind, L, H, seed, extra) -> RunResult:
    codes = sorted({s["code"] for s in steps})
    changed = sum(kept_heads(c, L, H) < L * H for c in codes)    # the full mask costs no forward of its own
    toks = phases.tokens or [1] * len(phases.corpus.items)
    phases.plan.phases["scored"] = [float((1 + changed) * t) for t in toks]

    names = corpus_metrics.metric_names(mkind, extra["reference"])

    def partial(phase, results):
        table = steps_table(results, steps, L, H)
        return RunResult(kind, phases.model_key, phases.corpus.key, table, running_summary(table, names), False,
                         phases.done, phases.total, dict(extra, running=len(results), steps=steps))

    phases.partial = partial
    d_model = int(extra["cfg"].d_model)
    results = phases.run("scored", dict(codes=codes, reference=extra["reference"]),
                         lambda r: corpus_records.scored(r, mkind, codes, d_model))
    summary = steps_summary(mkind, results, steps, phases.corpus.labels, seed, L, H, extra["reference"])
    out = dict(extra, workers=dict(phases.workers), steps=steps, estimate=phases.estimate(), **phases.notes())
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
