"""Path patching (Wang et al. 2022, as ARENA's TransformerLens IOI walkthrough implements it): how
much of the clean behaviour comes back when ONE sender head's clean output reaches ONE receiver
head's query, key or value input, and nothing else.

For a sender head (layer s, head h) and a receiver (layer r > s; "q": one query head, "k" / "v":
one K/V group, the unit GQA shares between query heads):

1. the corrupted prompt runs from block s with the sender's output (`hook_z`) taken from the clean
   run and every other head's output in blocks s..r-1 frozen at its corrupted value (the MLPs are
   recomputed, as in that walkthrough), up to block r's input;
2. the receiver's Q (or K, or V) is computed from that input;
3. the corrupted prompt runs again from block r with only that Q / K / V replaced by step 2's;
   everything after it is recomputed as usual. The metric and the recovered fraction are
   `attnviz.analysis.patching`'s.

All three steps are per-call patches in the one forward loop (`Transformer.iter_blocks`).
"""
from __future__ import annotations

import torch

from attnviz.analysis import patching
from attnviz.base.jobs import heavy_job

RECEIVER_KINDS = ("q", "k", "v")


def _freeze(bad: dict, sender: int | None, clean: dict):
    """Block outputs of every head at the corrupted run's, except the sender's, from the clean run."""
    def patch(name, t):
        if name != "z":
            return t
        z = bad["z"].clone()
        if sender is not None:
            z[:, sender] = clean["z"][:, sender]
        return z
    return patch


def _record(kind: str, kept: dict):
    def patch(name, t):
        if name == kind:
            kept["t"] = t
        return t
    return patch


def check_receiver(model, layer: int, unit: int, kind: str) -> int:
    """The receiver's local index in its layer (a query head, or a K/V group), or ValueError."""
    cfg = model.cfg
    if kind not in RECEIVER_KINDS:
        raise ValueError(f"the receiver is a head's q, k or v, not {kind!r}")
    if not 0 < layer < cfg.n_layers:
        raise ValueError(f"the receiver's layer must be 1..{cfg.n_layers - 1} (a sender sits in an earlier layer)")
    attn = model.net.blocks[layer].attn
    if kind == "q":
        local = attn.heads.tolist()
        if unit not in local:
            raise ValueError(f"head {unit} is not in layer {layer} (0..{cfg.n_heads - 1}, pruned heads excepted)")
        return local.index(unit)
    if not 0 <= unit < attn.n_kv:
        raise ValueError(f"K/V group {unit} is not in layer {layer} (0..{attn.n_kv - 1})")
    return unit


def path_map(model, pair: patching.Pair, layer: int, unit: int, kind: str, check=None, progress=None,
             senders: dict | None = None) -> patching.Patched:
    """The recovered fraction for every sender head (rows: layers 0..layer-1, columns: heads; the
    receiver's layer and those after it stay NaN) into receiver `unit` ("q": a query head, "k" / "v":
    a K/V group) of block `layer`. `senders` {layer: [heads]}: only those. `check()` runs before
    every block; `progress(done, total)` after every sender. Holds a heavy-job slot."""
    j = check_receiver(model, layer, unit, kind)
    if pair.corrupted_acts is None:
        raise ValueError("this pair keeps no corrupted activations: make it with patching.prepare")
    cfg, net, variant = model.cfg, model.net, getattr(model, "variant", None)
    todo = [(s, local, int(h)) for s in range(layer) for local, h in enumerate(net.blocks[s].attn.heads.tolist())
            if senders is None or int(h) in senders.get(s, ())]
    diffs = torch.full((cfg.n_layers, cfg.n_heads), float("nan"))
    with heavy_job("path patching"), torch.inference_mode():
        for done, (s, local, head) in enumerate(todo, 1):
            kept = {}
            freeze = {i: _freeze(pair.corrupted_acts[i], local if i == s else None, pair.clean_acts[i])
                      for i in range(s, layer)}
            freeze[layer] = _record(kind, kept)
            for _ in net.iter_blocks(pair.corrupted_states[s], s, layer + 1, variants=variant, check=check,
                                     patch=freeze):
                pass
            out = pair.corrupted_states[layer]
            step3 = {layer: patching.replace_unit(kind, j, kept["t"])}
            for step in net.iter_blocks(out, layer, variants=variant, check=check, patch=step3):
                out = step.out
            diffs[s, head] = patching.score(model, pair, out)
            if progress is not None:
                progress(done, len(todo))
    recovered = (diffs - pair.corrupted_diff) / (pair.clean_diff - pair.corrupted_diff)
    return patching.Patched(f"path to L{layer} {kind}{unit}", recovered, diffs, pair.clean_diff,
                            pair.corrupted_diff, [f"H{h}" for h in range(cfg.n_heads)], pair.metric)


def count(model, layer: int) -> int:
    """How many senders a receiver in block `layer` has."""
    return sum(b.attn.n_heads for b in model.net.blocks[:layer])
