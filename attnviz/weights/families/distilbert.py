"""DistilBERT (DistilBertModel, DistilBertForMaskedLM): BERT's post-norm layers under names of
its own, no token types, and its own config keys."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import bert
from attnviz.weights.mapper import Mapper, activation, get

NAME = "distilbert"
TASK = "encoder"
PREFIXES = ("distilbert.",)
SYNTHETIC = dict(bert.SYNTHETIC, type_vocab_size=0)


def has_mlm_head(sd: dict) -> bool:
    return any(k.startswith("vocab_transform.") for k in sd)


def config(hf, sd: dict) -> Config:
    d, h = get(hf, "dim"), get(hf, "n_heads")
    mlm = bert.tied_mlm(hf, has_mlm_head(sd))
    return bert.config(dict(hidden_size=d, num_attention_heads=h, num_hidden_layers=get(hf, "n_layers"),
                            intermediate_size=get(hf, "hidden_dim"), vocab_size=get(hf, "vocab_size"),
                            max_position_embeddings=get(hf, "max_position_embeddings")), sd).replace(
        family=NAME, activation=activation(get(hf, "activation", "gelu")), type_vocab_size=0,
        mlm_head=mlm, tie_embeddings=mlm)


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h, L = b.width("dim"), b.heads("n_heads"), b.layers("n_layers")
    params = b.blocks(L, d, h, h, None, b.ff("hidden_dim"), gated=False)
    return params + (b.vocab("vocab_size") + b.positions("max_position_embeddings")) * d


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    m.put("tok.weight", m.take("embeddings.word_embeddings.weight"))
    m.put("pos.weight", m.take("embeddings.position_embeddings.weight"))
    m.norm("emb_norm", "embeddings.LayerNorm")
    for i in range(cfg.n_layers):
        p, o = f"transformer.layer.{i}.", f"blocks.{i}."
        m.fused(o + "attn.qkv", [p + f"attention.{n}_lin" for n in "qkv"])
        m.linear(o + "attn.out", p + "attention.out_lin")
        m.norm(o + "norm1", p + "sa_layer_norm")
        m.linear(o + "mlp.fc_in", p + "ffn.lin1")
        m.linear(o + "mlp.fc_out", p + "ffn.lin2")
        m.norm(o + "norm2", p + "output_layer_norm")
    if cfg.mlm_head:
        bert.mlm_head(m, "vocab_transform", "vocab_layer_norm", "vocab_projector.bias")
    return m.out
