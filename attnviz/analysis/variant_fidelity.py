"""Attention variants swapped into a pretrained model, with fidelity (KL, top-1 agreement,
perplexity; an encoder's embedding cosine) and speed measured side by side with the unchanged model.

Reads a loaded `Model` and never changes it: the variants are call arguments.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnviz.base.limits import LIMITS
from attnviz.base.timing import Timing, measure
from attnviz.core.attention import parse_variant
from attnviz.core.model import Model
from attnviz.core.transformer import sentence_embedding


@dataclass
class Fidelity:
    label: str
    seconds: float            # median forward time with the variant
    reference_seconds: float  # median forward time of the unchanged model, measured alongside
    kl: float | None = None             # LM: mean KL(reference || variant) per token, nats
    top1: float | None = None           # LM: next-token argmax agreement
    perplexity: float | None = None     # LM: on the text itself
    reference_perplexity: float | None = None
    cosine: float | None = None         # encoder: mean-pooled sentence embedding
    token_cosine: float | None = None   # encoder: mean over tokens

    @property
    def speedup(self) -> float:
        return self.reference_seconds / self.seconds


def variant_fidelity(model: Model, text: str, variants, label: str = "", repeats: int = 3,
                     check=None) -> Fidelity:
    """Swap attention variants into the chosen layers (`variants`: a spec for every layer or
    {layer: spec}) and compare with the unchanged model on `text`. `check()` (e.g. a deadline's)
    runs before every forward pass and raises to stop."""
    if model.cfg.is_vision:
        raise ValueError("variant fidelity is measured on text models")
    L = model.cfg.n_layers
    if isinstance(variants, dict):
        bad = [k for k in variants if not 0 <= int(k) < L]
        if bad:
            raise ValueError(f"variant layers {bad} are outside 0..{L - 1}")
        spec = {int(k): parse_variant(v) for k, v in variants.items()}
    else:
        spec = parse_variant(variants)
    inp = model.inputs(text)
    ids = inp["input_ids"][:, : LIMITS.lab_max_tokens]  # bounded: explicit variants hold n x n per head
    if ids.shape[1] < 2:
        raise ValueError("the text needs at least two tokens to compare next-token predictions")
    net = model.net
    with torch.inference_mode():
        run_ref = lambda: net(input_ids=ids)                    # noqa: E731  fused softmax
        run_var = lambda: net(input_ids=ids, variants=spec)     # noqa: E731
        if check is not None:
            check()
        ref = run_ref()                                         # also the warm-up
        if check is not None:
            check()
        var = run_var()
        t_ref, t_var = [], []
        for _ in range(repeats):  # alternate, so both see the same machine load
            t_ref += measure(run_ref, 1, 0, check=check).times
            t_var += measure(run_var, 1, 0, check=check).times
    out = Fidelity(label or str(variants), Timing.of(t_var).median, Timing.of(t_ref).median)
    if ref.logits is not None and model.cfg.causal:
        logp_ref = ref.logits[0].float().log_softmax(-1)       # (n, vocab)
        logp_var = var.logits[0].float().log_softmax(-1)
        out.kl = (logp_ref.exp() * (logp_ref - logp_var)).sum(-1).mean().item()
        out.top1 = (logp_ref.argmax(-1) == logp_var.argmax(-1)).float().mean().item()
        target = ids[0, 1:]
        out.reference_perplexity = math.exp(F.nll_loss(logp_ref[:-1], target).item())
        out.perplexity = math.exp(F.nll_loss(logp_var[:-1], target).item())
    else:
        a, b = ref.hidden[0].float(), var.hidden[0].float()   # (n, d_model)
        out.cosine = float(sentence_embedding(a) @ sentence_embedding(b))   # the pooled embeddings
        out.token_cosine = F.cosine_similarity(a, b, dim=-1).mean().item()
    return out
