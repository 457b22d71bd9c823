"""RoBERTa (RobertaModel, RobertaForMaskedLM): BERT whose position table begins with padding's rows,
so positions count from `padding_idx + 1` and skip padding tokens; one token type; the masked-LM
head under `lm_head.`."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import bert
from attnviz.weights.mapper import Mapper, get

NAME = "roberta"
TASK = "encoder"
PREFIXES = ("roberta.",)
SYNTHETIC = dict(bert.SYNTHETIC, type_vocab_size=1, norm_eps=1e-5)
size = bert.size


def has_mlm_head(sd: dict) -> bool:
    return any(k.startswith("lm_head.dense") for k in sd)


def config(hf, sd: dict) -> Config:
    pad = get(hf, "pad_token_id")
    table = get(hf, "max_position_embeddings")
    if type(pad) is not int or not 0 <= pad < table - 1:
        raise ValueError(f"pad_token_id must be a row of the position table before its last (RoBERTa's "
                         f"positions count from it); got {pad!r:.40}")
    mlm = bert.tied_mlm(hf, has_mlm_head(sd))
    return bert.config(hf, sd).replace(family=NAME, pad_position=pad, mlm_head=mlm, tie_embeddings=mlm,
                                       max_positions=table - pad - 1)


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    bert.body(m, cfg)
    if cfg.mlm_head:
        bert.mlm_head(m, "lm_head.dense", "lm_head.layer_norm", "lm_head.bias")
    return m.out
