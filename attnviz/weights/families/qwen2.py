"""Qwen2: Llama with biases on the query, key and value projections (none on the output) and,
where `use_sliding_window`, windows on the layers `layer_types` names."""
from __future__ import annotations

from attnviz.core.config import Config
from attnviz.weights.families import llama

NAME = "qwen2"
TASK = "lm"
PREFIXES = llama.PREFIXES
SYNTHETIC = dict(llama.SYNTHETIC, qkv_bias=True, norm_eps=1e-6)
size, weights = llama.size, llama.weights


def config(hf, sd: dict) -> Config:
    return llama.config(hf, sd).replace(family=NAME, qkv_bias=True, out_bias=False)
