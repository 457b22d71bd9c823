"""Falcon: pre-LayerNorm decoder with rotary positions and one fused query_key_value projection,
in three layouts (transformers' `FalconAttention._split_heads`):
- `new_decoder_architecture` (Falcon-40B/180B, Falcon 2): `num_kv_heads` groups, each its query
  heads then its key and its value, [group, (q..., k, v), d_head]; attention and MLP in parallel
  through two norms (`ln_attn`, `ln_mlp`), or one (`num_ln_in_parallel_attn` = 1);
- `multi_query` (Falcon-7B): every query head, then one key and one value head, [Q|K|V] as ours;
  attention and MLP in parallel through one norm (`parallel_attn`) or one after the other;
- neither: per head (q, k, v), [head, (q, k, v), d_head], as GPT-NeoX's.
The last two are the first with one group and with groups of one head: one reordering to our
[Q|K|V] at load serves all three. Its rotary and rope scaling are Llama's, so the config
half is Llama's with these differences; ALiBi Falcons are refused."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import llama
from attnviz.weights.mapper import Mapper, activation, get

NAME = "falcon"
TASK = "lm"
PREFIXES = ("transformer.",)
SYNTHETIC = dict(task=TASK, norm="layernorm", positional="rotary", pre_norm=True, parallel=True, shared_norm=True,
                 activation="gelu", causal=True, qkv_bias=False, out_bias=False, mlp_bias=False,
                 tie_embeddings=True, norm_eps=1e-5)


# ---------------------------------------------------------------- config half
def kv_heads(hf) -> int:
    """Key/value heads of each layer, as `FalconAttention` splits them."""
    h = get(hf, "num_attention_heads")
    if get(hf, "new_decoder_architecture", False):
        return get(hf, "num_kv_heads") or h
    return 1 if get(hf, "multi_query", True) else h


def config(hf, sd: dict) -> Config:
    if get(hf, "alibi", False):
        raise ValueError("alibi=True (Falcon with ALiBi score biases instead of rotary positions) is not supported")
    new, parallel = bool(get(hf, "new_decoder_architecture", False)), bool(get(hf, "parallel_attn", True))
    norms = get(hf, "num_ln_in_parallel_attn") or (2 if new else 1)
    h = get(hf, "num_attention_heads")
    # the layouts transformers cannot run: refused here rather than guessed at
    if new and not parallel:
        raise ValueError("new_decoder_architecture with parallel_attn=False is not supported")
    if not new and parallel and norms != 1:
        raise ValueError("num_ln_in_parallel_attn=2 needs new_decoder_architecture")
    if not new and not get(hf, "multi_query", True) and (get(hf, "num_kv_heads") or h) != h:
        raise ValueError("num_kv_heads other than num_attention_heads needs new_decoder_architecture")
    d, bias = get(hf, "hidden_size"), bool(get(hf, "bias", False))
    return llama.config(hf, sd).replace(
        family=NAME, n_kv_heads=kv_heads(hf), d_head=d // h, d_ff=get(hf, "ffn_hidden_size") or 4 * d,
        norm="layernorm", norm_eps=get(hf, "layer_norm_epsilon", 1e-5), rotary_dim=0,
        activation=activation(get(hf, "activation", "gelu")), gated_mlp=False,
        qkv_bias=bias, out_bias=bias, mlp_bias=bias, parallel=parallel, shared_norm=parallel and norms == 1,
        windows=(), tie_embeddings=bool(get(hf, "tie_word_embeddings", True)))


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h, L = b.width("hidden_size"), b.heads("num_attention_heads"), b.layers("num_hidden_layers")
    ff = b.ff("ffn_hidden_size", optional=True) or 4 * d
    vocab = b.vocab("vocab_size")
    b.positions("max_position_embeddings")  # rotary: no table, but the bound still applies
    kv = b.int("num_kv_heads", 1, h, optional=True) if get(hf, "new_decoder_architecture", False) else None
    kv = kv or kv_heads(hf)
    if h % kv:
        raise b.fail(f"config.json: num_attention_heads ({h}) must be a multiple of num_kv_heads ({kv})")
    params = b.blocks(L, d, h, kv, None, ff, gated=False) + vocab * d
    return params + (0 if get(hf, "tie_word_embeddings", True) else vocab * d)


# ---------------------------------------------------------------- weights half
def grouped_qkv(t: torch.Tensor, cfg: Config) -> torch.Tensor:
    """A layer's fused rows (weight or bias) laid out [group, (its queries..., k, v), d_head] ->
    ours, [Q|K|V]. The three layouts are this one: multi-query is one group, the per-head layout
    groups of one query head."""
    h, kv, rest = cfg.n_heads, cfg.n_kv_heads, t.shape[1:]
    g = t.reshape(kv, h // kv + 2, cfg.d_head, *rest)
    return torch.cat([g[:, :-2].reshape(-1, *rest), g[:, -2].reshape(-1, *rest), g[:, -1].reshape(-1, *rest)])


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    m.put("tok.weight", m.take("word_embeddings.weight"))
    for i in range(cfg.n_layers):
        p, o = f"h.{i}.", f"blocks.{i}."
        if cfg.parallel and not cfg.shared_norm:   # the new architecture's two norms
            m.norm(o + "norm1", p + "ln_attn")
            m.norm(o + "norm2", p + "ln_mlp")
        else:
            m.norm(o + "norm1", p + "input_layernorm")
            if not cfg.parallel:
                m.norm(o + "norm2", p + "post_attention_layernorm")
        qkv = p + "self_attention.query_key_value."
        rows = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.d_head
        w = m.take(qkv + "weight")
        if w.shape[0] != rows:
            raise ValueError(f"{m.prefix}{qkv}weight has {w.shape[0]} rows; the config implies {rows}")
        m.put(o + "attn.qkv.weight", grouped_qkv(w, cfg))
        if cfg.qkv_bias:
            m.put(o + "attn.qkv.bias", grouped_qkv(m.take(qkv + "bias"), cfg))
        m.linear(o + "attn.out", p + "self_attention.dense", bias=cfg.out_bias)
        m.linear(o + "mlp.fc_in", p + "mlp.dense_h_to_4h", bias=cfg.mlp_bias)
        m.linear(o + "mlp.fc_out", p + "mlp.dense_4h_to_h", bias=cfg.mlp_bias)
    m.norm("norm", "ln_f")
    return m.output_head(cfg)
