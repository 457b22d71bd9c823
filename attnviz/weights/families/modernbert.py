"""ModernBERT (ModernBertModel, ModernBertForMaskedLM): a pre-norm encoder with rotary positions and
no position table, GeGLU MLPs, LayerNorms without biases by default, and local layers (keys within
`local_attention / 2` positions either side, their own RoPE base) between global ones; its first
block reads the normed embeddings without a norm of its own. Llama's rope and layer-type readers
serve it; the structure is its own."""
from __future__ import annotations

import torch

from attnviz.core.config import Config, rope_pairs
from attnviz.weights.families import bert, llama
from attnviz.weights.mapper import Mapper, activation, get

NAME = "modernbert"
TASK = "encoder"
PREFIXES = ("model.",)
SYNTHETIC = dict(task=TASK, norm="layernorm", norm_bias=False, norm_eps=1e-5, positional="rotary",
                 rope_theta=160_000.0, pre_norm=True, activation="gelu", gated_mlp=True, qkv_bias=False,
                 out_bias=False, mlp_bias=False, embedding_norm=True, first_input_norm=False)


def has_mlm_head(sd: dict) -> bool:
    return any(k.startswith("head.dense") for k in sd)


def config(hf, sd: dict) -> Config:
    d, h = get(hf, "hidden_size"), get(hf, "num_attention_heads")
    act = activation(get(hf, "hidden_activation", "gelu"))
    mlm = has_mlm_head(sd)
    if mlm and activation(get(hf, "classifier_activation", "gelu")) != act:
        raise ValueError("classifier_activation different from hidden_activation is not supported")
    rope = get(hf, "rope_parameters") or {}
    local = rope.get("sliding_attention") or {}
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"rope scaling {local.get('rope_type')!r} on the local layers is not supported")
    full = llama.rope_parameters(hf)
    # HF's local layers see keys at distance <= sliding_window (local_attention // 2); ours < window
    windows = tuple(w + 1 if w else 0 for w in llama.windows(hf))
    bias = bool(get(hf, "attention_bias", False))
    return Config(family=NAME, task=TASK, n_layers=get(hf, "num_hidden_layers"), n_heads=h, n_kv_heads=h,
                  d_model=d, d_head=d // h, d_ff=get(hf, "intermediate_size"), vocab_size=get(hf, "vocab_size"),
                  max_positions=get(hf, "max_position_embeddings"), norm_eps=get(hf, "norm_eps", 1e-5),
                  norm_bias=bool(get(hf, "norm_bias", False)), positional="rotary",
                  rope_theta=float(full.get("rope_theta", get(hf, "global_rope_theta", 160_000.0))),
                  rope_scaling=rope_pairs(full), pre_norm=True, activation=act, gated_mlp=True,
                  qkv_bias=bias, out_bias=bias, mlp_bias=bool(get(hf, "mlp_bias", False)),
                  windows=windows, local_rope_theta=float(local.get("rope_theta", 10_000.0)) if windows else 0.0,
                  embedding_norm=True, first_input_norm=False, mlm_head=mlm,
                  tie_embeddings=mlm and bool(get(hf, "tie_word_embeddings", True)))


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h, L = b.width("hidden_size"), b.heads("num_attention_heads"), b.layers("num_hidden_layers")
    b.positions("max_position_embeddings")  # rotary: no table, but the bound still applies
    vocab = b.vocab("vocab_size")
    return b.blocks(L, d, h, h, None, b.ff("intermediate_size"), gated=True) + 2 * vocab * d


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    bias = cfg.norm_bias
    m.put("tok.weight", m.take("embeddings.tok_embeddings.weight"))
    m.norm("emb_norm", "embeddings.norm", bias=bias)
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        if i or cfg.first_input_norm:
            m.norm(o + "norm1", p + "attn_norm", bias=bias)
        m.linear(o + "attn.qkv", p + "attn.Wqkv", bias=cfg.qkv_bias)
        m.linear(o + "attn.out", p + "attn.Wo", bias=cfg.out_bias)
        m.norm(o + "norm2", p + "mlp_norm", bias=bias)
        m.linear(o + "mlp.fc_in", p + "mlp.Wi", bias=cfg.mlp_bias)
        m.linear(o + "mlp.fc_out", p + "mlp.Wo", bias=cfg.mlp_bias)
    m.norm("norm", "final_norm", bias=bias)
    if cfg.mlm_head:  # beside the base model; a bias the config leaves out is zero (the same sums)
        m.prefix = ""
        m.linear("mlm_transform", "head.dense", bias=m.has("head.dense.bias"))
        m.norm("mlm_norm", "head.norm", bias=bias)
        if not m.has("head.dense.bias"):
            m.put("mlm_transform.bias", torch.zeros(cfg.d_model))
        m.put("lm_head.bias", m.take("decoder.bias") if m.has("decoder.bias") else torch.zeros(cfg.vocab_size))
        m.output_head(cfg, "decoder.weight")
    return m.out
