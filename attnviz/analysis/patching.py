"""Activation patching (Meng et al. 2022; Wang et al. 2022's IOI), with TransformerLens's conventions
(`transformer_lens.patching`): run a CLEAN prompt and a CORRUPTED one of the same token length,
then re-run the corrupted prompt with ONE activation replaced by its value from the clean run and
measure how much of the clean behaviour comes back.

- The metric is the logit difference logit[target] - logit[minus] at the last position (e.g.
  " Mary" - " John"). An encoder (MiniLM) has no logits: its metric compares the sentence embedding
  (mean-pooled, L2-normalised, `sentence_embedding`) with the clean run's, either as minus the
  Euclidean distance ("distance": the recovered fraction is 1 - |e - e_clean| / |e_corrupted -
  e_clean|, the share of the clean-corrupted distance closed) or as the cosine ("cosine").
- The score is the recovered fraction (patched - corrupted) / (clean - corrupted): 0 where the
  patch changes nothing, 1 where it restores the clean logit difference exactly (it can leave
  0..1).
- Head outputs ("z", `hook_z`): one query head's output, every position, before the output
  projection. Q ("q", `hook_q`): one query head's queries. K and V ("k", "v"): one K/V group's keys
  or values (with GQA, as SmolLM2, a K/V head is shared by a group of query heads, so K and V maps
  have n_kv_heads columns). All with rope applied where the model has it.
- Residual stream ("resid_pre"): block l's input at one position.

Every patched run goes through the one forward loop (`Transformer.iter_blocks`), starting at the
patched layer from the corrupted run's kept input of that layer, with the patch a per-call
argument: the shared model is never changed. The runs of one layer go as rows of one batch (each
row patching its own unit), so each weight read serves every unit of the layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from attnviz.analysis.effects import single_token
from attnviz.analysis.readouts import check_lm
from attnviz.base import memory
from attnviz.base.jobs import heavy_job
from attnviz.base.limits import LIMITS
from attnviz.core.transformer import sentence_embedding

KINDS = ("z", "q", "k", "v")
ROWS = 32       # patched runs a batch carries: (32, heads, tokens, tokens) weights stay small at the readout limit
KIND_NAMES = {"z": "head output", "q": "query", "k": "key", "v": "value", "resid_pre": "residual stream"}
METRICS = {"logit_diff": "logit difference", "distance": "embedding distance (minus)",
           "cosine": "embedding cosine with the clean run"}
ENCODER_METRICS = ("distance", "cosine")
SAMPLE_CLEAN = "When Mary and John went to the store, John gave a drink to"
SAMPLE_CORRUPTED = "When Mary and John went to the store, Mary gave a drink to"


@dataclass
class Pair:
    """The clean and corrupted runs a patching map starts from."""
    tokens: list[str]                        # the corrupted prompt's tokens
    clean_tokens: list[str]
    target: int | None                       # None for an encoder's embedding metric
    minus: int | None
    clean_diff: float                        # the metric on the clean run (the logit difference, ...)
    corrupted_diff: float
    clean_acts: list[dict]                   # per layer: "q", "k", "v", "z" of the clean run
    clean_states: list[torch.Tensor]         # per layer: the block's input (1, n, d), clean run
    corrupted_states: list[torch.Tensor]     # the same, corrupted run
    corrupted_acts: list[dict] | None = None  # per layer: "q", "k", "v", "z" of the corrupted run
    metric: str = "logit_diff"
    reference: torch.Tensor | None = None    # the clean run's sentence embedding (encoder metrics)


@dataclass
class Patched:
    """One map: rows are layers, columns heads, K/V groups or positions."""
    kind: str
    recovered: torch.Tensor                  # [L, columns] the recovered fraction
    diffs: torch.Tensor                      # [L, columns] the patched run's logit difference
    clean_diff: float
    corrupted_diff: float
    columns: list[str]
    metric: str = "logit_diff"

    def top(self, k: int = 5) -> list[tuple[int, int, float]]:
        flat = self.recovered.flatten()
        order = torch.argsort(flat.nan_to_num(float("-inf")), descending=True)[:k]
        cols = self.recovered.shape[1]
        return [(int(i) // cols, int(i) % cols, float(flat[i])) for i in order]


def token_id(model, token) -> int:
    """A token id, or the id of the ONE token a text names (" Mary")."""
    if isinstance(token, int):
        if not 0 <= token < model.cfg.vocab_size:
            raise ValueError(f"token id {token} is outside the vocabulary (0..{model.cfg.vocab_size - 1})")
        return token
    return single_token(model.tokenizer, token)[0]


def embedding(model, out) -> torch.Tensor:
    """The last block's output (1, n, d) -> the sentence embedding [d] an encoder is pooled to."""
    return sentence_embedding(model.net.finish(out, logits=False)[0][0])


def score(model, pair: Pair, out) -> float:
    """The pair's metric on one run's last block output (1, n, d)."""
    if pair.metric == "logit_diff":
        logits = model.net.finish(out[:, -1:])[1][0, -1].float()
        return float(logits[pair.target] - logits[pair.minus])
    e = embedding(model, out)
    if pair.metric == "cosine":
        return float(e @ pair.reference)
    return -float((e - pair.reference).norm())


def _run(model, ids, check):
    states = []
    net = model.net
    x = net.embed_text(ids[None])
    L = model.cfg.n_layers
    acts = [{} for _ in range(L)]
    patch = {i: (lambda name, t, i=i: acts[i].setdefault(name, t)) for i in range(L)}
    out = x
    for step in net.iter_blocks(x, variants=getattr(model, "variant", None), check=check, patch=patch):
        states.append(step.x)
        out = step.out
    return acts, states, out


def prepare(model, clean, corrupted, target=None, minus=None, check=None, metric: str | None = None) -> Pair:
    """Both prompts through the model once. ValueError when they tokenize to different lengths, a
    target is not one token, or the two prompts give the same metric (nothing to recover). A
    language model's metric is the logit difference (target, minus); an encoder's `metric` is
    "distance" (the default) or "cosine" of the sentence embedding with the clean run's."""
    encoder = model.kind == "encoder"
    metric = metric or ("distance" if encoder else "logit_diff")
    if metric not in (ENCODER_METRICS if encoder else ("logit_diff",)):
        raise ValueError(f"metric {metric!r} does not fit {model.info.key}: "
                         f"{'an encoder takes ' + ' or '.join(ENCODER_METRICS) if encoder else 'a language model takes logit_diff'}")
    if encoder:
        t = m = None
    else:
        check_lm(model)
        t, m = token_id(model, target), token_id(model, minus)
        if t == m:
            raise ValueError("the target and the minus token are the same: pick two different tokens")
    a, b = model.inputs(clean), model.inputs(corrupted)
    if len(a["ids"]) != len(b["ids"]):
        raise ValueError(f"the clean prompt has {len(a['ids'])} tokens and the corrupted one {len(b['ids'])}: "
                         "patching needs the same length (swap words of one token each)")
    n = len(a["ids"])
    if n > LIMITS.readout_max_tokens:
        raise ValueError(f"the prompts have {n} tokens; patching takes at most {LIMITS.readout_max_tokens}. "
                         "Shorten them.")
    memory.plan_capture("activation patching", layers=1, heads=model.cfg.n_heads, n=n, shorten="the prompts")
    with torch.inference_mode():
        acts, clean_states, clean_out = _run(model, a["ids"], check)
        bad_acts, corrupted_states, corrupted_out = _run(model, b["ids"], check)
        pair = Pair(b["tokens"], a["tokens"], t, m, 0.0, 0.0, acts, clean_states, corrupted_states, bad_acts,
                    metric, embedding(model, clean_out) if encoder else None)
        pair.clean_diff, pair.corrupted_diff = score(model, pair, clean_out), score(model, pair, corrupted_out)
    if abs(pair.clean_diff - pair.corrupted_diff) < 1e-6:
        raise ValueError(f"the clean and corrupted prompts give the same {METRICS[metric]} ({pair.clean_diff:.4f}): "
                         "there is nothing to recover; corrupt the prompt differently")
    return pair


def replace_unit(kind: str, j, clean: torch.Tensor):
    """A patch replacing unit j (a head, a K/V group) of activation `kind` with `clean`'s; `j` a
    list: row b of the batch gets its own unit j[b]."""
    def patch(name, t):
        if name != kind:
            return t
        t = t.clone()
        if isinstance(j, int):
            t[:, j] = clean[:, j]
        else:
            rows = torch.arange(len(j))
            t[rows, j] = clean[0, j].to(t.dtype)
        return t
    return patch


def _units(model, kind: str, pair: Pair) -> tuple[list[str], list[list[tuple[int, int]]]]:
    """The map's column names and, per layer, (local index, column) pairs to patch."""
    cfg, blocks = model.cfg, model.net.blocks
    if kind == "resid_pre":
        n = len(pair.tokens)
        cols = [f"{p}: {tok}" for p, tok in enumerate(pair.tokens)]
        return cols, [[(p, p) for p in range(n)] for _ in blocks]
    if kind in ("z", "q"):
        return [f"H{h}" for h in range(cfg.n_heads)], \
            [[(j, int(h)) for j, h in enumerate(b.attn.heads.tolist())] for b in blocks]
    return [f"KV{g}" for g in range(cfg.n_kv_heads)], [[(j, j) for j in range(b.attn.n_kv)] for b in blocks]


def count(model, kind: str, pair: Pair) -> int:
    """How many patched runs a map takes."""
    return sum(len(u) for u in _units(model, kind, pair)[1])


def patch_map(model, pair: Pair, kind: str, check=None, progress=None, units: dict | None = None) -> Patched:
    """The recovered fraction for every unit of `kind` ("z", "q", "k", "v" or "resid_pre"), one
    patched run each, from the patched layer on. `check()` runs before every block (a deadline or
    a cancel); `progress(done, total)` after every batch of patched runs; `units` {layer: [columns]}: patch only
    those (the rest stay NaN). Holds a heavy-job slot."""
    if kind not in KIND_NAMES:
        raise ValueError(f"unknown activation {kind!r}: one of {', '.join(KIND_NAMES)}")
    cols, every = _units(model, kind, pair)
    units = every if units is None else [[(j, c) for j, c in u if c in units.get(i, ())]
                                         for i, u in enumerate(every)]
    L, total = len(units), sum(len(u) for u in units)
    diffs = torch.full((L, len(cols)), float("nan"))
    net, variant, done = model.net, getattr(model, "variant", None), 0
    with heavy_job("activation patching"), torch.inference_mode():
        for layer, pairs in enumerate(units):
            for at in range(0, len(pairs), ROWS):
                chunk = pairs[at:at + ROWS]
                js = [j for j, _ in chunk]
                x = pair.corrupted_states[layer].expand(len(chunk), -1, -1).clone()
                patch = None
                if kind == "resid_pre":
                    x[torch.arange(len(js)), js] = pair.clean_states[layer][0, js]
                else:
                    patch = {layer: replace_unit(kind, js, pair.clean_acts[layer][kind])}
                out = x
                for step in net.iter_blocks(x, layer, variants=variant, check=check, patch=patch):
                    out = step.out
                for b, (_, col) in enumerate(chunk):
                    diffs[layer, col] = score(model, pair, out[b:b + 1])
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
    recovered = (diffs - pair.corrupted_diff) / (pair.clean_diff - pair.corrupted_diff)
    return Patched(kind, recovered, diffs, pair.clean_diff, pair.corrupted_diff, cols, pair.metric)


def patch_frame(result: Patched) -> pd.DataFrame:
    """One row per patched unit: layer, column, the patched metric (`patched_logit_diff` for a
    language model, `patched_distance` / `patched_cosine` for an encoder), the recovered fraction."""
    rows = []
    for layer in range(result.recovered.shape[0]):
        for c, name in enumerate(result.columns):
            r = float(result.recovered[layer, c])
            if r == r:
                rows.append({"activation": KIND_NAMES.get(result.kind, result.kind), "layer": layer, "unit": name,
                             f"patched_{result.metric}": float(result.diffs[layer, c]), "recovered": r})
    return pd.DataFrame(rows)
