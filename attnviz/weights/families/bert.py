"""BERT (BertModel, BertForMaskedLM, sentence encoders such as MiniLM): post-norm encoder,
learned positions, optional token types and masked-LM head."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.mapper import Mapper, activation, get

NAME = "bert"
TASK = "encoder"
PREFIXES = ("bert.",)
# A synthetic shape of this family (`attnviz.latency.results.parse_synthetic`): the structure, no sizes.
SYNTHETIC = dict(task=TASK, norm="layernorm", positional="learned", pre_norm=False, activation="gelu",
                 type_vocab_size=2, embedding_norm=True, final_norm=False)


def has_mlm_head(sd: dict) -> bool:
    return any(k.startswith("cls.predictions.transform") for k in sd)


def tied_mlm(hf, has_head: bool) -> bool:
    """Whether the checkpoint has a masked-LM head, whose output layer is the token embeddings;
    one of its own is refused by name."""
    if has_head and get(hf, "tie_word_embeddings", True) is False:
        raise ValueError("tie_word_embeddings=False (a masked-LM output layer of its own) is not supported")
    return has_head


# ---------------------------------------------------------------- config half
def config(hf, sd: dict) -> Config:
    """BERT's config, and the parent of every encoder family written as its difference."""
    if get(hf, "position_embedding_type", "absolute") not in ("absolute", None):
        raise ValueError(f"position_embedding_type {get(hf, 'position_embedding_type')!r:.40} is not supported "
                         "(only absolute position embeddings)")
    if get(hf, "is_decoder", False):
        raise ValueError("is_decoder (an encoder run as a causal decoder) is not supported")
    d, h = get(hf, "hidden_size"), get(hf, "num_attention_heads")
    mlm = tied_mlm(hf, has_mlm_head(sd))
    return Config(family=NAME, task=TASK, n_layers=get(hf, "num_hidden_layers"), n_heads=h, n_kv_heads=h,
                  d_model=d, d_head=d // h, d_ff=get(hf, "intermediate_size"),
                  vocab_size=get(hf, "vocab_size"), max_positions=get(hf, "max_position_embeddings"),
                  norm_eps=get(hf, "layer_norm_eps", 1e-12), positional="learned",
                  activation=activation(get(hf, "hidden_act", "gelu")), pre_norm=False,
                  type_vocab_size=get(hf, "type_vocab_size", 0), embedding_norm=True, final_norm=False,
                  mlm_head=mlm, tie_embeddings=mlm)


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h, L = b.width("hidden_size"), b.heads("num_attention_heads"), b.layers("num_hidden_layers")
    params = b.blocks(L, d, h, h, None, b.ff("intermediate_size"), gated=False)
    types = b.int("type_vocab_size", 0, b.MAX_TYPE_VOCAB, default=0)
    e = b.width("embedding_size", optional=True) or d  # ELECTRA's narrower embeddings
    return params + (b.vocab("vocab_size") + b.positions("max_position_embeddings") + types) * e + (e * d if e != d else 0)


# ---------------------------------------------------------------- weights half
def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    body(m, cfg)
    if cfg.mlm_head:
        mlm_head(m, "cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias")
    return m.out


def body(m: Mapper, cfg: Config, projection: str = "embeddings_project"):
    """The embeddings and the encoder's layers, named as BERT, RoBERTa and ELECTRA name them
    (ELECTRA's narrower embeddings reach the blocks through `projection`)."""
    m.put("tok.weight", m.take("embeddings.word_embeddings.weight"))
    m.put("pos.weight", m.take("embeddings.position_embeddings.weight"))
    if cfg.type_vocab_size:
        m.put("types.weight", m.take("embeddings.token_type_embeddings.weight"))
    m.norm("emb_norm", "embeddings.LayerNorm")
    if cfg.d_embed:
        m.linear("embed_proj", projection)
    for i in range(cfg.n_layers):
        p, o = f"encoder.layer.{i}.", f"blocks.{i}."
        m.fused(o + "attn.qkv", [p + f"attention.self.{n}" for n in ("query", "key", "value")])
        m.linear(o + "attn.out", p + "attention.output.dense")
        m.norm(o + "norm1", p + "attention.output.LayerNorm")
        m.linear(o + "mlp.fc_in", p + "intermediate.dense")
        m.linear(o + "mlp.fc_out", p + "output.dense")
        m.norm(o + "norm2", p + "output.LayerNorm")


def mlm_head(m: Mapper, transform: str, norm: str, bias: str):
    """The masked-LM head, which sits beside the base model: its transform, norm and output bias
    (the output weight is tied to the token embeddings)."""
    m.prefix = ""
    m.linear("mlm_transform", transform)
    m.norm("mlm_norm", norm)
    m.put("lm_head.bias", m.take(bias))
