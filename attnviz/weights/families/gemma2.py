"""Gemma 2: Gemma with sandwich norms (each sub-layer's output normed before the sum),
alternating sliding-window and global layers (`layer_types`), scores scaled by
`query_pre_attn_scalar`^-½ and soft-capped (`attn_logit_softcapping`), logits soft-capped
(`final_logit_softcapping`)."""
from __future__ import annotations

from attnviz.core.config import Config
from attnviz.weights.families import gemma
from attnviz.weights.mapper import get

NAME = "gemma2"
TASK = "lm"
PREFIXES = gemma.PREFIXES
SYNTHETIC = dict(gemma.SYNTHETIC, output_norms=True, attn_softcap=50.0, final_softcap=30.0)
size, weights = gemma.size, gemma.weights


def config(hf, sd: dict) -> Config:
    return gemma.config(hf, sd).replace(
        family=NAME, output_norms=True, attn_scale=float(get(hf, "query_pre_attn_scalar")) ** -0.5,
        attn_softcap=float(get(hf, "attn_logit_softcapping") or 0.0),
        final_softcap=float(get(hf, "final_logit_softcapping") or 0.0))
