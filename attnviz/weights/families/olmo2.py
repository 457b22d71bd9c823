"""OLMo 2: Llama with norms on the sub-layers' outputs only (post_attention_layernorm and
post_feedforward_layernorm, before each sum; none on their inputs) and one RMSNorm over all the
layer's queries, and one over all its keys, before they split into heads (QK-norm over the layer)."""
from __future__ import annotations

from attnviz.core.config import Config
from attnviz.weights.families import llama

NAME = "olmo2"
TASK = "lm"
PREFIXES = llama.PREFIXES
SYNTHETIC = dict(llama.SYNTHETIC, input_norms=False, output_norms=True, qk_norm="all", tie_embeddings=False)
size, weights = llama.size, llama.weights


def config(hf, sd: dict) -> Config:
    return llama.config(hf, sd).replace(family=NAME, input_norms=False, output_norms=True, qk_norm="all")
