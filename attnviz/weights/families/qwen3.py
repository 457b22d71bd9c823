"""Qwen3: Llama with an RMSNorm over each head's queries and keys before RoPE (QK-norm)."""
from __future__ import annotations

from attnviz.core.config import Config
from attnviz.weights.families import llama

NAME = "qwen3"
TASK = "lm"
PREFIXES = llama.PREFIXES
SYNTHETIC = dict(llama.SYNTHETIC, qk_norm="head", norm_eps=1e-6)
size, weights = llama.size, llama.weights


def config(hf, sd: dict) -> Config:
    return llama.config(hf, sd).replace(family=NAME, qk_norm="head")
