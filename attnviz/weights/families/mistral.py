"""Mistral: Llama with a sliding window on every layer (`sliding_window`, None: none)."""
from __future__ import annotations

from attnviz.core.config import Config
from attnviz.weights.families import llama
from attnviz.weights.mapper import get

NAME = "mistral"
TASK = "lm"
PREFIXES = llama.PREFIXES
SYNTHETIC = dict(llama.SYNTHETIC, tie_embeddings=False)
size, weights = llama.size, llama.weights


def config(hf, sd: dict) -> Config:
    cfg = llama.config(hf, sd)
    window = get(hf, "sliding_window")
    return cfg.replace(family=NAME, windows=(int(window),) * cfg.n_layers if window else ())
