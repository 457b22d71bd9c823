"""Marian (MarianMTModel, the opus-mt translators): post-norm encoder-decoder with causal
self-attention and cross-attention in the decoder, sinusoidal positions (sin | cos halves),
embeddings scaled by sqrt(d_model), output tied to the shared embeddings plus `final_logits_bias`.
Builds `attnviz.core.seq2seq.Seq2Seq` (TASK "translation"), not a `Transformer`.

The layer layout (`layers`) and the blocks' config (`blocks`) are BART's, mBART's and M2M100's too;
their files reuse them.
"""
from __future__ import annotations

import math

import torch

from attnviz.core.config import Config
from attnviz.core.seq2seq import Seq2SeqConfig
from attnviz.weights.mapper import Mapper, activation, get

NAME = "marian"
TASK = "translation"
PREFIXES = ("model.",)


# ---------------------------------------------------------------- config half
def blocks(hf, family: str, pre_norm: bool = False) -> Config:
    """The blocks' config both sides read, in the layout Marian, BART, mBART and M2M100 share: LayerNorm
    (eps 1e-5), biases everywhere, one MLP width and head count on both sides; post-norm unless `pre_norm`."""
    heads, ffn, d = get(hf, "encoder_attention_heads"), get(hf, "encoder_ffn_dim"), get(hf, "d_model")
    if get(hf, "decoder_attention_heads", heads) != heads or get(hf, "decoder_ffn_dim", ffn) != ffn:
        raise ValueError("encoder and decoder must have the same number of heads and FFN width")
    return Config(family=family, task="encoder", n_layers=get(hf, "encoder_layers"), n_heads=heads, n_kv_heads=heads,
                  d_model=d, d_head=d // heads, d_ff=ffn, vocab_size=get(hf, "vocab_size"), norm_eps=1e-5,
                  activation=activation(get(hf, "activation_function", "gelu")), positional="none", pre_norm=pre_norm)


def post_norm_only(hf):
    if get(hf, "normalize_before", False) or get(hf, "add_final_layer_norm", False):
        raise ValueError("pre-norm variants (normalize_before / add_final_layer_norm) of this architecture are "
                         "not supported; mBART and M2M100 checkpoints are")


def shape(hf) -> dict:
    """The seq2seq fields Marian, BART, mBART and M2M100 configs share: decoder layers, embedding
    scale, special ids (the target language forced first, where the config names one)."""
    forced = get(hf, "forced_bos_token_id")
    return dict(n_dec_layers=get(hf, "decoder_layers"), decoder="attention",
                embed_scale=math.sqrt(get(hf, "d_model")) if get(hf, "scale_embedding", False) else 1.0,
                eos_id=get(hf, "eos_token_id"), pad_id=get(hf, "pad_token_id"),
                max_positions=get(hf, "max_position_embeddings"), forced_bos_id=-1 if forced is None else forced)


def config(hf, sd: dict) -> Seq2SeqConfig:
    if not get(hf, "share_encoder_decoder_embeddings", True):
        raise ValueError("Marian checkpoints with separate source and target vocabularies are not supported")
    post_norm_only(hf)
    start = get(hf, "decoder_start_token_id")
    return Seq2SeqConfig.of(blocks(hf, NAME), positional="hf_marian",
                            decoder_start_id=get(hf, "pad_token_id") if start is None else start, **shape(hf))


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h = b.width("d_model"), b.heads("encoder_attention_heads")
    L_enc, L_dec, ff = b.layers("encoder_layers"), b.layers("decoder_layers"), b.ff("encoder_ffn_dim")
    blocks = b.blocks(L_enc + L_dec, d, h, h, None, ff, gated=False)
    return blocks + L_dec * 4 * d * d + (b.vocab("vocab_size") + 2 * b.positions("max_position_embeddings")) * d


# ---------------------------------------------------------------- weights half
def layers(m: Mapper, cfg: Seq2SeqConfig):
    """Encoder and decoder layers, shared embeddings and the output bias (Marian and BART)."""
    shared = m.take("shared.weight")
    m.put("tok.weight", shared)
    saved = m.prefix
    m.prefix = ""  # the output head sits beside the base model
    if m.has("lm_head.weight") and not torch.equal(m.take("lm_head.weight"), shared):
        raise ValueError("the output projection is not tied to the shared embeddings; not supported")
    bias = m.take("final_logits_bias").reshape(-1) if m.has("final_logits_bias") else torch.zeros(cfg.vocab_size)
    m.put("lm_head.bias", bias)
    m.prefix = saved
    for i in range(cfg.n_enc_layers):
        p, o = f"encoder.layers.{i}.", f"encoder.{i}."
        m.fused(o + "attn.qkv", [p + f"self_attn.{n}_proj" for n in "qkv"])
        m.linear(o + "attn.out", p + "self_attn.out_proj")
        m.norm(o + "norm1", p + "self_attn_layer_norm")
        m.linear(o + "mlp.fc_in", p + "fc1")
        m.linear(o + "mlp.fc_out", p + "fc2")
        m.norm(o + "norm2", p + "final_layer_norm")
    for i in range(cfg.n_dec_layers):
        p, o = f"decoder.layers.{i}.", f"decoder.{i}."
        for theirs, ours in (("self_attn", "self_attn"), ("encoder_attn", "cross")):
            m.linear(o + ours + ".q", p + theirs + ".q_proj")
            m.fused(o + ours + ".kv", [p + theirs + ".k_proj", p + theirs + ".v_proj"])
            m.linear(o + ours + ".out", p + theirs + ".out_proj")
        m.norm(o + "norm_self", p + "self_attn_layer_norm")
        m.norm(o + "norm_cross", p + "encoder_attn_layer_norm")
        m.linear(o + "mlp.fc_in", p + "fc1")
        m.linear(o + "mlp.fc_out", p + "fc2")
        m.norm(o + "norm_ffn", p + "final_layer_norm")


def weights(cfg: Seq2SeqConfig, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    layers(m, cfg)  # positions are computed (sinusoidal), never read from the checkpoint
    return m.out
