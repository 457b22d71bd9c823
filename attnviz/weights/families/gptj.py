"""GPT-J: pre-LayerNorm decoder whose attention and MLP read ONE shared norm of the block's input
and add at once, rotary positions (base 10000, no scaling) on the first `rotary_dim` channels of
each head, no attention biases, tanh GELU, an output layer with a bias.

GPT-J rotates channel pairs (2i, 2i+1); ours rotates (i, i + rotary_dim/2). The query and key rows
of each head's rotating channels are reordered alike at load (evens, then odds), so pair i of ours
holds GPT-J's pair i: every score q·k is unchanged (a dot product does not see the order of its
channels), and so is every attention weight and output. The step-by-step head shows the queries
and keys in that order."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.mapper import Mapper, activation, get

NAME = "gptj"
TASK = "lm"
PREFIXES = ("transformer.",)
SYNTHETIC = dict(task=TASK, norm="layernorm", positional="rotary", pre_norm=True, parallel=True, shared_norm=True,
                 activation="gelu_tanh", causal=True, qkv_bias=False, out_bias=False, lm_head_bias=True,
                 norm_eps=1e-5)


# ---------------------------------------------------------------- config half
def config(hf, sd: dict) -> Config:
    d, h = get(hf, "n_embd"), get(hf, "n_head")
    dh, rotary = d // h, get(hf, "rotary_dim")
    if rotary is None:
        # transformers then builds a table as wide as the model, which fits only one head
        raise ValueError("rotary_dim None (rotary over the whole model width) is not supported; "
                         "GPT-J checkpoints name the channels of each head that rotate")
    return Config(family=NAME, task=TASK, n_layers=get(hf, "n_layer"), n_heads=h, n_kv_heads=h, d_model=d,
                  d_head=dh, d_ff=get(hf, "n_inner") or 4 * d, vocab_size=get(hf, "vocab_size"),
                  max_positions=get(hf, "n_positions"), norm_eps=get(hf, "layer_norm_epsilon", 1e-5),
                  positional="rotary", rope_theta=10000.0, rotary_dim=rotary if rotary < dh else 0,
                  causal=True, pre_norm=True, parallel=True, shared_norm=True,
                  activation=activation(get(hf, "activation_function", "gelu_new")), qkv_bias=False,
                  out_bias=False, lm_head_bias=True, tie_embeddings=bool(get(hf, "tie_word_embeddings", False)))


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h, L = b.width("n_embd"), b.heads("n_head"), b.layers("n_layer")
    ff = b.ff("n_inner", optional=True) or 4 * d
    vocab = b.vocab("vocab_size")
    b.positions("n_positions")  # rotary: no table, but the bound still applies
    params = b.blocks(L, d, h, h, None, ff, gated=False) + vocab * d
    return params + (0 if get(hf, "tie_word_embeddings", False) else vocab * d)


# ---------------------------------------------------------------- weights half
def half_split_rows(weight: torch.Tensor, n_heads: int, rotary: int) -> torch.Tensor:
    """Each head's first `rotary` rows from interleaved pairs (2i, 2i+1) to halves (i, i + rotary/2)."""
    rows, cols = weight.shape
    order = torch.cat([torch.arange(0, rotary, 2), torch.arange(1, rotary, 2), torch.arange(rotary, rows // n_heads)])
    return weight.reshape(n_heads, rows // n_heads, cols)[:, order].reshape(rows, cols)


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    m.put("tok.weight", m.take("wte.weight"))
    for i in range(cfg.n_layers):
        p, o = f"h.{i}.", f"blocks.{i}."
        m.norm(o + "norm1", p + "ln_1")   # feeds the attention and the MLP alike
        q, k, v = (m.take(p + f"attn.{n}_proj.weight") for n in "qkv")
        q, k = (half_split_rows(t, cfg.n_heads, cfg.rope_dim) for t in (q, k))
        m.put(o + "attn.qkv.weight", torch.cat([q, k, v]))
        m.linear(o + "attn.out", p + "attn.out_proj", bias=False)
        m.linear(o + "mlp.fc_in", p + "mlp.fc_in")
        m.linear(o + "mlp.fc_out", p + "mlp.fc_out")
    m.norm("norm", "ln_f")
    return m.output_head(cfg)
