"""Phi (Phi-1, Phi-1.5, Phi-2): pre-LayerNorm decoder whose attention and MLP read ONE shared norm of
the block's input and add at once, rotary positions on the first `partial_rotary_factor` of each
head (half, by default), biases everywhere (the output layer's too), tanh GELU, a final norm.
Its rotary, rope scaling and grouped K/V are Llama's, so the config half is Llama's with these
differences."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import llama
from attnviz.weights.mapper import Mapper, activation, get

NAME = "phi"
TASK = "lm"
PREFIXES = llama.PREFIXES
SYNTHETIC = dict(task=TASK, norm="layernorm", positional="rotary", pre_norm=True, parallel=True, shared_norm=True,
                 activation="gelu_tanh", causal=True, lm_head_bias=True, norm_eps=1e-5)


# ---------------------------------------------------------------- config half
def config(hf, sd: dict) -> Config:
    if get(hf, "qk_layernorm", False):
        # a LayerNorm (mean and bias) over each head's queries and keys: our QK-norm is an RMSNorm
        raise ValueError("qk_layernorm (a LayerNorm on each head's queries and keys) is not supported")
    return llama.config(hf, sd).replace(
        family=NAME, norm="layernorm", norm_eps=get(hf, "layer_norm_eps", 1e-5),
        activation=activation(get(hf, "hidden_act", "gelu_new")), gated_mlp=False, qkv_bias=True, out_bias=True,
        mlp_bias=True, parallel=True, shared_norm=True, lm_head_bias=True, windows=())


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h, L = b.width("hidden_size"), b.heads("num_attention_heads"), b.layers("num_hidden_layers")
    ff, vocab = b.ff("intermediate_size"), b.vocab("vocab_size")
    b.positions("max_position_embeddings")  # rotary: no table, but the bound still applies
    kv = b.int("num_key_value_heads", 1, h, optional=True) or h
    if h % kv:
        raise b.fail(f"config.json: num_attention_heads ({h}) must be a multiple of num_key_value_heads ({kv})")
    dh = b.int("head_dim", 1, b.MAX_D_HEAD, optional=True)
    params = b.blocks(L, d, h, kv, dh, ff, gated=False) + vocab * d
    return params + (0 if get(hf, "tie_word_embeddings", False) else vocab * d)


# ---------------------------------------------------------------- weights half
def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    m.put("tok.weight", m.take("embed_tokens.weight"))
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        m.norm(o + "norm1", p + "input_layernorm")   # feeds the attention and the MLP alike
        m.fused(o + "attn.qkv", [p + f"self_attn.{n}_proj" for n in "qkv"])
        m.linear(o + "attn.out", p + "self_attn.dense")
        m.linear(o + "mlp.fc_in", p + "mlp.fc1")
        m.linear(o + "mlp.fc_out", p + "mlp.fc2")
    m.norm("norm", "final_layernorm")
    return m.output_head(cfg)
