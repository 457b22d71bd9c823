"""Qwen3-MoE: Qwen3 whose MLPs are sparse mixtures of `num_experts` experts of width
`moe_intermediate_size`, the top `num_experts_per_tok` per token (renormalised when
`norm_topk_prob`). Dense layers among them (`mlp_only_layers`, `decoder_sparse_step` > 1) are refused."""
from __future__ import annotations

from attnviz.core.config import Config
from attnviz.weights.families import llama, qwen3
from attnviz.weights.mapper import get

NAME = "qwen3_moe"
TASK = "lm"
PREFIXES = llama.PREFIXES
SYNTHETIC = dict(qwen3.SYNTHETIC, n_experts=8, experts_per_token=2, expert_renorm=False)
size, weights = llama.size, llama.weights


def config(hf, sd: dict) -> Config:
    if get(hf, "mlp_only_layers") or get(hf, "decoder_sparse_step", 1) != 1:
        raise ValueError("mlp_only_layers / decoder_sparse_step (dense layers among the experts) is not supported")
    return qwen3.config(hf, sd).replace(family=NAME, d_ff=int(get(hf, "moe_intermediate_size")),
                                        n_experts=int(get(hf, "num_experts")),
                                        experts_per_token=int(get(hf, "num_experts_per_tok")),
                                        expert_renorm=bool(get(hf, "norm_topk_prob", False)))
