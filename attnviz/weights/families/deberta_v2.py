"""DeBERTa-v2 / v3 (DebertaV2Model, DebertaV2ForMaskedLM): BERT's post-norm layers with disentangled
attention: each head's scores add content→position ("c2p": its query · the embedding of the
query-key distance, through the key projection) and position→content ("p2c": the key · that
embedding through the query projection) terms, the distances log-bucketed, the embeddings shared
by the layers (and normed, in v3), every term scaled by 1/√(d_head · (1 + terms)). The position
table of the input is optional (`position_biased_input`)."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import bert
from attnviz.weights.mapper import Mapper, get

NAME = "deberta-v2"
TASK = "encoder"
PREFIXES = ("deberta.",)
TERMS = ("c2p", "p2c")
SYNTHETIC = dict(bert.SYNTHETIC, type_vocab_size=0, norm_eps=1e-7, positional="none", disentangled=TERMS,
                 rel_span=256, rel_log_max=512, rel_shared_proj=True, rel_norm=True)


def config(hf, sd: dict) -> Config:
    if get(hf, "conv_kernel_size", 0):
        raise ValueError("conv_kernel_size (DeBERTa-v2's convolution beside the first layer) is not supported")
    d, h = get(hf, "hidden_size"), get(hf, "num_attention_heads")
    if (get(hf, "embedding_size") or d) != d:
        raise ValueError("embedding_size different from hidden_size (DeBERTa's embedding projection) is not supported")
    if (get(hf, "attention_head_size") or d // h) != d // h:
        raise ValueError("attention_head_size different from hidden_size / num_attention_heads is not supported")
    kinds = get(hf, "pos_att_type") or []
    kinds = [t.strip() for t in kinds.lower().split("|")] if isinstance(kinds, str) else list(kinds)
    if unknown := sorted(set(kinds) - set(TERMS)):
        raise ValueError(f"pos_att_type {unknown[0]!r:.20} is not supported; supported: {', '.join(TERMS)}")
    norms = [x.strip() for x in (get(hf, "norm_rel_ebd") or "none").lower().split("|")]
    if unknown := sorted(set(norms) - {"none", "layer_norm"}):
        raise ValueError(f"norm_rel_ebd {unknown[0]!r:.20} is not supported; supported: none, layer_norm")
    relative = bool(get(hf, "relative_attention", False))
    max_rel = get(hf, "max_relative_positions", -1)
    max_rel = max_rel if max_rel >= 1 else get(hf, "max_position_embeddings")
    buckets = get(hf, "position_buckets", -1)
    # the newer head reads the token embeddings whatever tie_word_embeddings says; the legacy one ties by it
    mlm = bert.tied_mlm(hf, bert.has_mlm_head(sd)) or any(k.startswith("lm_predictions.") for k in sd)
    # the scale counts the listed terms even where relative_attention leaves them out
    return bert.config(hf, sd).replace(
        family=NAME, attn_scale=(d // h * (1 + len(set(kinds)))) ** -0.5,
        positional="learned" if get(hf, "position_biased_input", True) else "none",
        disentangled=tuple(t for t in TERMS if t in kinds) if relative else (),
        rel_span=(buckets if buckets > 0 else max_rel) if relative else 0,
        rel_log_max=max_rel if relative and buckets > 0 else 0,
        rel_shared_proj=bool(get(hf, "share_att_key", False)), rel_norm=relative and "layer_norm" in norms,
        mlm_head=mlm, tie_embeddings=mlm)


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, L = b.width("hidden_size"), b.layers("num_hidden_layers")
    span = b.int("position_buckets", -1, b.MAX_POSITIONS, default=-1)
    span = span if span > 0 else b.int("max_relative_positions", -1, b.MAX_POSITIONS, default=-1)
    return bert.size(hf, b) + 2 * max(span, 0) * d + L * 2 * d * d   # position embeddings and projections


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    m.put("tok.weight", m.take("embeddings.word_embeddings.weight"))
    if cfg.positional == "learned":
        m.put("pos.weight", m.take("embeddings.position_embeddings.weight"))
    if cfg.type_vocab_size:
        m.put("types.weight", m.take("embeddings.token_type_embeddings.weight"))
    m.norm("emb_norm", "embeddings.LayerNorm")
    if cfg.disentangled:
        m.put("rel_emb.weight", m.take("encoder.rel_embeddings.weight"))
        if cfg.rel_norm:
            m.norm("rel_norm", "encoder.LayerNorm")
    for i in range(cfg.n_layers):
        p, o = f"encoder.layer.{i}.", f"blocks.{i}."
        m.fused(o + "attn.qkv", [p + f"attention.self.{n}_proj" for n in ("query", "key", "value")])
        if cfg.disentangled and not cfg.rel_shared_proj:
            if "c2p" in cfg.disentangled:
                m.linear(o + "attn.pos_k", p + "attention.self.pos_key_proj")
            if "p2c" in cfg.disentangled:
                m.linear(o + "attn.pos_q", p + "attention.self.pos_query_proj")
        m.linear(o + "attn.out", p + "attention.output.dense")
        m.norm(o + "norm1", p + "attention.output.LayerNorm")
        m.linear(o + "mlp.fc_in", p + "intermediate.dense")
        m.linear(o + "mlp.fc_out", p + "output.dense")
        m.norm(o + "norm2", p + "output.LayerNorm")
    if cfg.mlm_head and any(k.startswith("lm_predictions.") for k in sd):
        bert.mlm_head(m, "lm_predictions.lm_head.dense", "lm_predictions.lm_head.LayerNorm",
                      "lm_predictions.lm_head.bias")
    elif cfg.mlm_head:  # the legacy head, named as BERT's
        bert.mlm_head(m, "cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                      "cls.predictions.bias")
    return m.out
