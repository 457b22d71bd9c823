"""GPT-2 (GPT2Model, GPT2LMHeadModel): pre-norm decoder, learned positions, Conv1D weights
stored (in, out), tied output embeddings."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.mapper import Mapper, activation, get

NAME = "gpt2"
TASK = "lm"
PREFIXES = ("transformer.",)
# A synthetic shape of this family (`attnviz.latency.results.parse_synthetic`): the structure, no sizes.
SYNTHETIC = dict(task=TASK, norm="layernorm", positional="learned", pre_norm=True, activation="gelu_tanh",
                 causal=True, tie_embeddings=True, norm_eps=1e-5)


# ---------------------------------------------------------------- config half
def config(hf, sd: dict) -> Config:
    if get(hf, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError("GPT-2 checkpoints with scale_attn_by_inverse_layer_idx are not supported")
    d, h = get(hf, "n_embd"), get(hf, "n_head")
    return Config(family=NAME, task=TASK, n_layers=get(hf, "n_layer"), n_heads=h, n_kv_heads=h, d_model=d,
                  d_head=d // h, d_ff=get(hf, "n_inner") or 4 * d, vocab_size=get(hf, "vocab_size"),
                  max_positions=get(hf, "n_positions"), norm_eps=get(hf, "layer_norm_epsilon", 1e-5),
                  positional="learned", causal=True, pre_norm=True,
                  activation=activation(get(hf, "activation_function", "gelu_new")), tie_embeddings=True)


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h, L = b.width("n_embd"), b.heads("n_head"), b.layers("n_layer")
    ff = b.ff("n_inner", optional=True) or 4 * d
    return b.blocks(L, d, h, h, None, ff, gated=False) + (b.vocab("vocab_size") + b.positions("n_positions")) * d


# ---------------------------------------------------------------- weights half
def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    m.put("tok.weight", m.take("wte.weight"))
    m.put("pos.weight", m.take("wpe.weight"))
    for i in range(cfg.n_layers):
        p, o = f"h.{i}.", f"blocks.{i}."
        m.norm(o + "norm1", p + "ln_1")
        m.linear(o + "attn.qkv", p + "attn.c_attn", transpose=True)  # Conv1D stores (in, out)
        m.linear(o + "attn.out", p + "attn.c_proj", transpose=True)
        m.norm(o + "norm2", p + "ln_2")
        m.linear(o + "mlp.fc_in", p + "mlp.c_fc", transpose=True)
        m.linear(o + "mlp.fc_out", p + "mlp.c_proj", transpose=True)
    m.norm("norm", "ln_f")
    return m.out
