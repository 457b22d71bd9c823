"""Mixtral: Mistral whose MLP is a sparse mixture of experts (a router picks the top
`num_experts_per_tok` of `num_local_experts` per token; their weights renormalised)."""
from __future__ import annotations

from attnviz.core.config import Config
from attnviz.weights.families import llama, mistral
from attnviz.weights.mapper import get

NAME = "mixtral"
TASK = "lm"
PREFIXES = llama.PREFIXES
SYNTHETIC = dict(mistral.SYNTHETIC, n_experts=8, experts_per_token=2)
size, weights = llama.size, llama.weights


def config(hf, sd: dict) -> Config:
    return mistral.config(hf, sd).replace(family=NAME, n_experts=int(get(hf, "num_local_experts")),
                                          experts_per_token=int(get(hf, "num_experts_per_tok")))
