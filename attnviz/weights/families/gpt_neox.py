"""GPT-NeoX (Pythia, GPT-NeoX-20B): pre-LayerNorm decoder whose attention and MLP read the block's
input through a norm each and add at once (`use_parallel_residual`; False: one after the other),
rotary positions on the first `partial_rotary_factor` of each head (Pythia: a quarter), one fused
query_key_value projection whose rows are grouped per head, biases, an untied output layer.
Its rotary and rope scaling are Llama's, so the config half is Llama's with these differences."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import llama
from attnviz.weights.mapper import Mapper, activation, get

NAME = "gpt_neox"
TASK = "lm"
PREFIXES = ("gpt_neox.",)
SYNTHETIC = dict(task=TASK, norm="layernorm", positional="rotary", pre_norm=True, parallel=True,
                 activation="gelu", causal=True, norm_eps=1e-5)


# ---------------------------------------------------------------- config half
def config(hf, sd: dict) -> Config:
    d, h = get(hf, "hidden_size"), get(hf, "num_attention_heads")
    bias = bool(get(hf, "attention_bias", True))
    # every head has its own keys and values, d_model / n_heads wide, whatever else the config holds
    return llama.config(hf, sd).replace(
        family=NAME, n_kv_heads=h, d_head=d // h, norm="layernorm", norm_eps=get(hf, "layer_norm_eps", 1e-5),
        activation=activation(get(hf, "hidden_act", "gelu")), gated_mlp=False, qkv_bias=bias, out_bias=bias,
        mlp_bias=True, parallel=bool(get(hf, "use_parallel_residual", True)), windows=())


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h, L = b.width("hidden_size"), b.heads("num_attention_heads"), b.layers("num_hidden_layers")
    ff, vocab = b.ff("intermediate_size"), b.vocab("vocab_size")
    b.positions("max_position_embeddings")  # rotary: no table, but the bound still applies
    params = b.blocks(L, d, h, h, None, ff, gated=False) + vocab * d
    return params + (0 if get(hf, "tie_word_embeddings", False) else vocab * d)


# ---------------------------------------------------------------- weights half
def per_head_qkv(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows laid out [head, (q, k, v), d_head] -> ours, [(q, k, v), head, d_head] (a weight or a bias)."""
    rest = t.shape[1:]
    return t.reshape(n_heads, 3, -1, *rest).transpose(0, 1).reshape(-1, *rest)


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    m.put("tok.weight", m.take("embed_in.weight"))
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        m.norm(o + "norm1", p + "input_layernorm")
        m.norm(o + "norm2", p + "post_attention_layernorm")
        qkv = p + "attention.query_key_value."
        m.put(o + "attn.qkv.weight", per_head_qkv(m.take(qkv + "weight"), cfg.n_heads))
        if cfg.qkv_bias:
            m.put(o + "attn.qkv.bias", per_head_qkv(m.take(qkv + "bias"), cfg.n_heads))
        m.linear(o + "attn.out", p + "attention.dense", bias=cfg.out_bias)
        m.linear(o + "mlp.fc_in", p + "mlp.dense_h_to_4h")
        m.linear(o + "mlp.fc_out", p + "mlp.dense_4h_to_h")
    m.norm("norm", "final_layer_norm")
    m.prefix = ""  # `embed_out` in the original checkpoints
    return m.output_head(cfg, "lm_head.weight" if m.has("lm_head.weight") else "embed_out.weight")
