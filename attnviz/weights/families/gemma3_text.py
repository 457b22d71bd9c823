"""Gemma 3 (text): Gemma 2 with QK-norm, five sliding-window layers to one global, and two RoPE
bases: the global layers' (`rope_parameters["full_attention"]`, possibly scaled) and the
windowed layers' (`rope_parameters["sliding_attention"]`, unscaled)."""
from __future__ import annotations

from attnviz.core.config import Config
from attnviz.weights.families import gemma2
from attnviz.weights.mapper import get

NAME = "gemma3_text"
TASK = "lm"
PREFIXES = gemma2.PREFIXES
SYNTHETIC = dict(gemma2.SYNTHETIC, qk_norm="head", attn_softcap=0.0, final_softcap=0.0)
size, weights = gemma2.size, gemma2.weights


def config(hf, sd: dict) -> Config:
    cfg = gemma2.config(hf, sd)
    rope = get(hf, "rope_parameters") or {}
    local = rope.get("sliding_attention") or {}
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"rope scaling {local.get('rope_type')!r} on the sliding-window layers is not supported")
    theta = float(local.get("rope_theta", get(hf, "rope_local_base_freq", 10000.0)))
    return cfg.replace(family=NAME, qk_norm="head", local_rope_theta=theta if cfg.windows else 0.0)
