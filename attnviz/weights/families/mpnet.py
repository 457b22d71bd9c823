"""MPNet (MPNetModel, MPNetForMaskedLM; all-mpnet-base-v2): RoBERTa's positions (its padding row is
always 1) plus a score bias per head from log-bucketed relative positions, one table read by every
layer; no token types; BERT's post-norm layers under names of their own."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import bert, roberta
from attnviz.weights.mapper import Mapper, get

NAME = "mpnet"
TASK = "encoder"
PREFIXES = ("mpnet.",)
PADDING_ROW = 1   # MPNet's embeddings fix padding_idx at 1 whatever the config's pad_token_id
BUCKETS, MAX_DISTANCE = 32, 128   # what MPNet computes its buckets with, whatever the config says
SYNTHETIC = dict(bert.SYNTHETIC, type_vocab_size=0, norm_eps=1e-5, pad_position=PADDING_ROW,
                 rel_buckets=BUCKETS)
has_mlm_head = roberta.has_mlm_head


def config(hf, sd: dict) -> Config:
    buckets = get(hf, "relative_attention_num_buckets", BUCKETS)
    if buckets != BUCKETS:
        raise ValueError(f"relative_attention_num_buckets {buckets!r:.20} is not supported (MPNet computes "
                         f"its buckets with {BUCKETS})")
    mlm = bert.tied_mlm(hf, has_mlm_head(sd))
    cfg = bert.config(hf, sd)
    if mlm and cfg.activation != "gelu":  # its masked-LM head applies GELU whatever hidden_act says
        raise ValueError(f"hidden_act {get(hf, 'hidden_act')!r:.40} with MPNet's masked-LM head is not supported")
    return cfg.replace(family=NAME, type_vocab_size=0, pad_position=PADDING_ROW, rel_buckets=BUCKETS,
                       rel_max_distance=MAX_DISTANCE, mlm_head=mlm, tie_embeddings=mlm,
                       max_positions=get(hf, "max_position_embeddings") - PADDING_ROW - 1)


def size(hf, b) -> int:
    return bert.size(hf, b) + BUCKETS * b.heads("num_attention_heads")


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    m.put("tok.weight", m.take("embeddings.word_embeddings.weight"))
    m.put("pos.weight", m.take("embeddings.position_embeddings.weight"))
    m.norm("emb_norm", "embeddings.LayerNorm")
    m.put("rel_bias.table.weight", m.take("encoder.relative_attention_bias.weight"))
    for i in range(cfg.n_layers):
        p, o = f"encoder.layer.{i}.", f"blocks.{i}."
        m.fused(o + "attn.qkv", [p + f"attention.attn.{n}" for n in "qkv"])
        m.linear(o + "attn.out", p + "attention.attn.o")
        m.norm(o + "norm1", p + "attention.LayerNorm")
        m.linear(o + "mlp.fc_in", p + "intermediate.dense")
        m.linear(o + "mlp.fc_out", p + "output.dense")
        m.norm(o + "norm2", p + "output.LayerNorm")
    if cfg.mlm_head:
        bert.mlm_head(m, "lm_head.dense", "lm_head.layer_norm", "lm_head.bias")
    return m.out
