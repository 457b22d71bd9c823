"""The work a corpus run sends to its engine (`corpus_engine`): module-level functions that a Dask
worker imports by name, each loading its model once per process (`worker_model`).

A task carries a batch of items (`batch_task`): language models and sentence encoders run the
batch's texts padded into shared passes and a pruning curve's head masks as a batch dimension
(`corpus_batch`), so each weight read serves many rows; translators, speech and vision models, and
a translator scored against its native engine, run their items one at a time (`masks_task`,
`ablation_task`, the per-item reference every batched figure equals up to float rounding). Every
item keeps its own seed, taken from its index, so the figures never depend on the batch or the worker.
"""
from __future__ import annotations

import numpy as np
import torch

from attnviz.analysis import corpus_batch, corpus_metrics, importance
from attnviz.analysis.corpus import PAIR, ready_item
from attnviz.analysis.corpus_engine import worker_model, worker_native
from attnviz.analysis.pruning import decode_mask

ITEM_TOKENS = 128           # an item's importance is taken over its first 128 tokens (one window)
GRADIENT_KINDS = ("lm", "encoder")


def item_seed(seed: int, index: int) -> int:
    """An item's own seed: the same whichever process runs it."""
    return int(seed) * 1_000_003 + int(index)


def item_tokens(model, items: list) -> list[int] | None:
    """Tokens each text item runs as (a sentence pair: both parts; cut as the run cuts it), or None
    for a model whose items are not text."""
    if not corpus_batch.batchable(model) or not all(isinstance(t, str) for t in items):
        return None
    return [sum(len(corpus_metrics.item_ids(model, part, corpus_metrics.MAX_TOKENS)[0])
                for part in (t.split(PAIR)[:2] if not model.next_token else [t])) for t in items]


def facts_task(model_key: str, params: dict, index: int, item) -> dict:
    """The model's kind and shape, and (`params["texts"]`) the tokens of each text, for the run's plan."""
    model = worker_model(model_key)
    return dict(kind=corpus_metrics.model_kind(model), mask_layers=int(model.mask_layers),
                n_heads=int(model.cfg.n_heads), cfg=model.cfg, batched=corpus_batch.batchable(model),
                tokens=item_tokens(model, params.get("texts") or []))


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


def _tokens(model, item) -> int | None:
    tokenizer = getattr(model, "tokenizer", None)
    return len(tokenizer(item)["input_ids"]) if isinstance(item, str) and tokenizer is not None else None


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
    return dict(full=full, steps=steps, tokens=_tokens(model, item))


def _batched(model, params: dict) -> bool:
    return corpus_batch.batchable(model) and params.get("reference", "full") == "full"


def _importance_batch(model, params, chunk) -> dict[int, dict]:
    windows = [importance.eval_windows(model, item, max_tokens=ITEM_TOKENS, window=ITEM_TOKENS).ids[0]
               for _, item in chunk]
    raws = corpus_batch.gradient_raws(model, windows, [item_seed(params["seed"], i) for i, _ in chunk],
                                      importance.GRAD_PROBES)
    return {i: dict(raw=raw, tokens=len(w)) for (i, _), raw, w in zip(chunk, raws, windows)}


def _masks_batch(model, params, chunk) -> dict[int, dict]:
    kind = corpus_metrics.model_kind(model)
    L, H = int(model.mask_layers), int(model.cfg.n_heads)
    codes = list(params["codes"])
    masks = [None] + [decode_mask(code, L, H).float() for code in codes]
    outs = corpus_batch.masked_outputs(model, [str(item) for _, item in chunk], masks)
    got = {}
    for (i, item), per_mask in zip(chunk, outs):
        full = per_mask[0]
        steps = {code: dict(metrics=corpus_metrics.compare(kind, full, pruned), pruned=pruned)
                 for code, pruned in zip(codes, per_mask[1:])}
        got[i] = dict(full=full, steps=steps, tokens=_tokens(model, item))
    return got


def batch_task(model_key: str, params: dict, index: int, chunk: list) -> dict[int, dict]:
    """A batch of (index, item) of one phase (`params["phase"]`: "importance" or "scored") ->
    {index: that item's result}, the same figures the per-item tasks give."""
    model = worker_model(model_key)
    phase = params["phase"]
    gradient = corpus_metrics.model_kind(model) in GRADIENT_KINDS
    if _batched(model, params):
        return _importance_batch(model, params, chunk) if phase == "importance" else \
            _masks_batch(model, params, chunk)
    one = (importance_task if gradient else ablation_task) if phase == "importance" else masks_task
    return {i: one(model_key, params, i, item) for i, item in chunk}
