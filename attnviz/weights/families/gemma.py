"""Gemma: Llama with the token embeddings scaled by √d_model, RMSNorms that multiply by (1 + w)
(folded into w when read, so our RMSNorm computes the same), GeGLU (tanh GELU) MLPs, a head width
of its own (`head_dim`), often one K/V head (multi-query), tied embeddings."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import llama
from attnviz.weights.mapper import activation, get

NAME = "gemma"
TASK = "lm"
PREFIXES = llama.PREFIXES
SYNTHETIC = dict(llama.SYNTHETIC, activation="gelu_tanh", norm_eps=1e-6)
size = llama.size


def config(hf, sd: dict) -> Config:
    if get(hf, "use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention (a Gemma used as an encoder) is not supported")
    act = get(hf, "hidden_activation") or get(hf, "hidden_act", "gelu_pytorch_tanh")
    return llama.config(hf, sd).replace(family=NAME, activation=activation(act),
                                        embed_scale=float(get(hf, "hidden_size")) ** 0.5,
                                        tie_embeddings=bool(get(hf, "tie_word_embeddings", True)))


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    out = llama.weights(cfg, sd)
    # Gemma's norms compute x̂ * (1 + w) in float32: the same as x̂ * w' with w' = 1 + w
    return {k: v + 1.0 if k.endswith("norm.weight") or "norm1" in k or "norm2" in k or "_norm." in k else v
            for k, v in out.items()}
