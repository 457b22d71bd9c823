"""OPT (OPTModel, OPTForCausalLM): GPT-2's decoder with ReLU MLPs, separate q/k/v projections, a
position table offset by 2 (folded at load), and a post-norm variant (`do_layer_norm_before=False`)
with no final norm.

OPT-350m's narrower word embeddings (`word_embed_proj_dim` < `hidden_size`, with `project_in` after
the lookup and `project_out` before the tied output layer) are folded at load: the projections are
linear and touch nothing else, so the embedding table becomes E·W_inᵀ and the output layer E·W_out,
both hidden_size wide. Logits and every attention are the model's; the last hidden state shown is
the one before `project_out`."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.mapper import Mapper, activation, get

NAME = "opt"
TASK = "lm"
PREFIXES = ("model.decoder.", "decoder.")
SYNTHETIC = dict(task=TASK, norm="layernorm", positional="learned", pre_norm=True, activation="relu",
                 causal=True, tie_embeddings=True, norm_eps=1e-5)
# Position p reads row p + 2 of OPT's table (fairseq kept rows for padding): the first rows are dropped.
OFFSET = 2


# ---------------------------------------------------------------- config half
def config(hf, sd: dict) -> Config:
    d, h = get(hf, "hidden_size"), get(hf, "num_attention_heads")
    projected = (get(hf, "word_embed_proj_dim") or d) != d
    if not get(hf, "layer_norm_elementwise_affine", True):
        raise ValueError("OPT's layer_norm_elementwise_affine=False (LayerNorms without weights) is not supported")
    pre = bool(get(hf, "do_layer_norm_before", True))
    bias = bool(get(hf, "enable_bias", True))
    return Config(family=NAME, task=TASK, n_layers=get(hf, "num_hidden_layers"), n_heads=h, n_kv_heads=h,
                  d_model=d, d_head=d // h, d_ff=get(hf, "ffn_dim"), vocab_size=get(hf, "vocab_size"),
                  max_positions=get(hf, "max_position_embeddings"), norm_eps=1e-5, positional="learned",
                  causal=True, pre_norm=pre, activation=activation(get(hf, "activation_function", "relu")),
                  qkv_bias=bias, out_bias=bias, mlp_bias=bias,
                  # post-norm blocks end normed; a pre-norm OPT may drop its final norm (old checkpoints)
                  final_norm=pre and not get(hf, "_remove_final_layer_norm", False),
                  # folded projections give the input and output tables each their own values
                  tie_embeddings=bool(get(hf, "tie_word_embeddings", True)) and not projected)


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h, L = b.width("hidden_size"), b.heads("num_attention_heads"), b.layers("num_hidden_layers")
    vocab, positions = b.vocab("vocab_size"), b.positions("max_position_embeddings")
    params = b.blocks(L, d, h, h, None, b.ff("ffn_dim"), gated=False) + (vocab + positions + OFFSET) * d
    if (get(hf, "word_embed_proj_dim") or d) != d:   # folded at load: two tables hidden_size wide
        return params + vocab * d
    return params + (0 if get(hf, "tie_word_embeddings", True) else vocab * d)


# ---------------------------------------------------------------- weights half
def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    table = m.take("embed_tokens.weight")
    if table.shape[1] != cfg.d_model:   # OPT-350m: the projections folded into the two tables
        w_in, w_out = m.take("project_in.weight"), m.take("project_out.weight")
        out_table = sd["lm_head.weight"].float() if "lm_head.weight" in sd else table   # the output layer, tied or not
        m.put("tok.weight", table.double().matmul(w_in.double().t()).to(table.dtype))
        m.put("lm_head.weight", out_table.double().matmul(w_out.double()).to(table.dtype))
    else:
        m.put("tok.weight", table)
    m.put("pos.weight", m.take("embed_positions.weight")[OFFSET:])
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        m.norm(o + "norm1", p + "self_attn_layer_norm")
        m.fused(o + "attn.qkv", [p + f"self_attn.{n}_proj" for n in "qkv"], bias=cfg.qkv_bias)
        m.linear(o + "attn.out", p + "self_attn.out_proj", bias=cfg.out_bias)
        m.norm(o + "norm2", p + "final_layer_norm")
        m.linear(o + "mlp.fc_in", p + "fc1", bias=cfg.mlp_bias)
        m.linear(o + "mlp.fc_out", p + "fc2", bias=cfg.mlp_bias)
    if cfg.final_norm:
        m.norm("norm", "final_layer_norm")
    return m.out if "lm_head.weight" in m.out else m.output_head(cfg)
