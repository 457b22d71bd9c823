"""Activation patching in a translator (en-pt, pt-en): a source sentence and a corrupted one of the
same token length (one word swapped), TransformerLens's conventions as in
`attnviz.analysis.patching`.

- Both sources are translated greedily; the clean translation is teacher-forced in every run, up to
  the first target position where the two translations part. The metric is the logit difference
  there: logit[the clean translation's token] - logit[the corrupted translation's token] (a
  difference of log-probabilities, the same number).
- "cross": one cross-attention head's output (decoder layer l, head h, every target position,
  before the output projection) from the clean run into the corrupted run.
- "enc_resid": encoder block l's input at one source position from the clean run (the rest of the
  encoder, then the decoder, recomputed).

Every run is the model's own `encode` / `start` / `step` (the one block runner) with the patch a
per-call argument; the shared model is never changed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.analysis.patching import Patched, replace_unit
from attnviz.base import memory
from attnviz.base.jobs import heavy_job
from attnviz.base.limits import LIMITS

KINDS = {"cross": "cross-attention head output", "enc_resid": "encoder residual stream"}
SAMPLE_CLEAN = "The black cat sleeps on the sofa."
SAMPLE_CORRUPTED = "The black dog sleeps on the sofa."


@dataclass
class TranslationPair:
    source_tokens: list[str]                 # the corrupted source's pieces
    clean_tokens: list[str]
    clean_text: str                          # the clean source's greedy translation
    corrupted_text: str
    prefix: list[str]                        # the clean translation's pieces before the scored position
    feed: torch.Tensor                       # (1, t + 1) the decoder's input: start + that prefix
    target: int                              # the clean translation's token at the scored position
    minus: int                               # the corrupted translation's token there
    target_label: str
    minus_label: str
    clean_diff: float
    corrupted_diff: float
    clean_cross: list[torch.Tensor]          # per decoder layer: the cross heads' outputs (1, h, t+1, dh)
    clean_states: list[torch.Tensor]         # per encoder layer: the block's input (1, S, d), clean source
    corrupted_states: list[torch.Tensor]     # the same, corrupted source
    corrupted_memory: torch.Tensor           # the encoder's output (1, S, d), corrupted source


def check_translator(model):
    if not hasattr(model, "translate") or getattr(model, "pieces", None) is None or \
            model.cfg.task != "translation":
        raise ValueError(f"{model.info.key} is not a text translator: translation patching needs en-pt or pt-en")


def _run(model, feed, *, src=None, resume=None, states_out=None, cross_patch=None, memory_out=None, check=None):
    """One teacher-forced run: the encoder (from the ids `src`, or from `resume` (layer, x)) unless
    `memory_out` (its output) is given, then the decoder on `feed` -> (last position's logits
    [vocab], the encoder's output)."""
    net = model.net
    if memory_out is None:
        memory_out, _ = net.encode(None if src is None else src[None], resume=resume, check=check,
                                   states_out=states_out)
    out = net.step(feed, net.start(memory_out), patch=cross_patch)
    return out.logits[0, -1].float(), memory_out


def prepare(model, clean: str, corrupted: str, check=None) -> TranslationPair:
    """Both sources translated (greedy) and run teacher-forced on the clean translation. ValueError
    when they tokenize to different lengths or translate alike (nothing to tell apart)."""
    check_translator(model)
    a, a_labels, cut_a = model.source(clean)
    b, b_labels, cut_b = model.source(corrupted)
    if cut_a or cut_b:
        raise ValueError(f"the sources are longer than {LIMITS.max_source_tokens} tokens: shorten them")
    if len(a) != len(b):
        raise ValueError(f"the clean source has {len(a)} tokens and the corrupted one {len(b)}: patching needs "
                         "the same length (swap words of one token each)")
    if torch.equal(a, b):
        raise ValueError("the clean and corrupted sources are the same: change a word of the corrupted one")
    memory.plan_capture("translation patching", layers=1, heads=model.cfg.n_heads, n=len(a), shorten="the sources")
    ta = model.translate(a, attentions=False)
    tb = model.translate(b, attentions=False)
    ia, ib = ta.target_ids.tolist(), tb.target_ids.tolist()
    t = next((i for i, (x, y) in enumerate(zip(ia, ib)) if x != y), None)
    if t is None:
        raise ValueError(f"both sources translate as {ta.text!r}: there is no token to tell them apart; "
                         "swap a word that changes the translation")
    feed = torch.tensor([[model.cfg.decoder_start_id] + ia[:t]], dtype=torch.long)
    clean_states, bad_states, cross = [], [], {}
    record = {i: (lambda name, z, i=i: cross.setdefault(i, z) if name == "z" else z)
              for i in range(model.cfg.n_dec_layers)}
    with torch.inference_mode():
        clean_logits, _ = _run(model, feed, src=a, states_out=clean_states, cross_patch=record, check=check)
        bad_logits, bad_memory = _run(model, feed, src=b, states_out=bad_states, check=check)
    diff = (lambda lg: float(lg[ia[t]] - lg[ib[t]]))
    label = model.pieces.label
    return TranslationPair(b_labels, a_labels, ta.text, tb.text, [label(i) for i in ia[:t]], feed, ia[t], ib[t],
                           label(ia[t]), label(ib[t]), diff(clean_logits), diff(bad_logits),
                           [cross[i] for i in range(model.cfg.n_dec_layers)], clean_states, bad_states, bad_memory)


def count(model, kind: str, pair: TranslationPair) -> int:
    c = model.cfg
    return c.n_dec_layers * c.n_heads if kind == "cross" else c.n_enc_layers * len(pair.source_tokens)


def patch_map(model, pair: TranslationPair, kind: str, check=None, progress=None) -> Patched:
    """The recovered fraction for every cross-attention head ("cross": rows = decoder layers) or
    every encoder block input position ("enc_resid": rows = encoder layers), one patched run each.
    `check()` runs before every encoder block; `progress(done, total)` after every run. Holds a
    heavy-job slot."""
    if kind not in KINDS:
        raise ValueError(f"unknown activation {kind!r}: one of {', '.join(KINDS)}")
    c = model.cfg
    if kind == "cross":
        cols = [f"H{h}" for h in range(c.n_heads)]
        units = [(layer, h) for layer in range(c.n_dec_layers) for h in range(c.n_heads)]
        rows = c.n_dec_layers
    else:
        cols = [f"{p}: {tok}" for p, tok in enumerate(pair.source_tokens)]
        units = [(layer, p) for layer in range(c.n_enc_layers) for p in range(len(cols))]
        rows = c.n_enc_layers
    diffs = torch.full((rows, len(cols)), float("nan"))
    with heavy_job("translation patching"), torch.inference_mode():
        for done, (layer, j) in enumerate(units, 1):
            if kind == "cross":  # the corrupted encoder's output is the same in every cross run
                if check is not None:
                    check()
                logits, _ = _run(model, pair.feed, memory_out=pair.corrupted_memory,
                                 cross_patch={layer: replace_unit("z", j, pair.clean_cross[layer])})
            else:
                x = pair.corrupted_states[layer].clone()
                x[:, j] = pair.clean_states[layer][:, j]
                logits, _ = _run(model, pair.feed, resume=(layer, x), check=check)
            diffs[layer, j] = float(logits[pair.target] - logits[pair.minus])
            if progress is not None:
                progress(done, len(units))
    recovered = (diffs - pair.corrupted_diff) / (pair.clean_diff - pair.corrupted_diff)
    return Patched(kind, recovered, diffs, pair.clean_diff, pair.corrupted_diff, cols)
