"""ELECTRA (ElectraModel, ElectraForMaskedLM: the generator; the discriminator's base model):
BERT with embeddings of their own width (`embedding_size`), projected up to the blocks' width, and
a masked-LM head that maps back down to it before the tied output layer."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import bert
from attnviz.weights.mapper import Mapper, get

NAME = "electra"
TASK = "encoder"
PREFIXES = ("electra.",)
SYNTHETIC = bert.SYNTHETIC
size = bert.size


def has_mlm_head(sd: dict) -> bool:
    return any(k.startswith("generator_predictions.") for k in sd)


def config(hf, sd: dict) -> Config:
    mlm = bert.tied_mlm(hf, has_mlm_head(sd))
    cfg = bert.config(hf, sd)
    if mlm and cfg.activation != "gelu":  # the generator's head applies GELU whatever hidden_act says
        raise ValueError(f"hidden_act {get(hf, 'hidden_act')!r:.40} with ELECTRA's masked-LM head is not supported")
    e = get(hf, "embedding_size") or cfg.d_model
    return cfg.replace(family=NAME, d_embed=e if e != cfg.d_model else 0, mlm_head=mlm, tie_embeddings=mlm)


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    bert.body(m, cfg)
    if cfg.mlm_head:
        bert.mlm_head(m, "generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head.bias")
    return m.out
