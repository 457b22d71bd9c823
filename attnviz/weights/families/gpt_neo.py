"""GPT-Neo (GPTNeoModel, GPTNeoForCausalLM): GPT-2's block with global and local (sliding-window)
layers (`attention_types`, `window_size`), unscaled scores (no 1/√d_head), q/k/v projections without
biases, nn.Linear weights stored (out, in)."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import gpt2
from attnviz.weights.mapper import Mapper, activation, get

NAME = "gpt_neo"
TASK = "lm"
PREFIXES = gpt2.PREFIXES
SYNTHETIC = dict(gpt2.SYNTHETIC, attn_scale=1.0, qkv_bias=False)
KINDS = ("global", "local")   # a layer's attention type; local layers see keys within window_size


# ---------------------------------------------------------------- config half
def windows(hf, n_layers: int) -> tuple:
    """Each layer's window from `attention_types` ([[["global", "local"], 12]]: the pair 12 times)."""
    types = [kind for kinds, repeat in get(hf, "attention_types") or [] for _ in range(repeat) for kind in kinds]
    unknown = sorted(set(types) - set(KINDS))
    if unknown:
        raise ValueError(f"GPT-Neo attention type {unknown[0]!r} is not supported; supported: {', '.join(KINDS)}")
    if len(types) != n_layers:
        raise ValueError(f"attention_types lists {len(types)} layers; the model has {n_layers}")
    window = int(get(hf, "window_size", 256))
    return tuple(window if kind == "local" else 0 for kind in types) if "local" in types else ()


def config(hf, sd: dict) -> Config:
    d, h, L = get(hf, "hidden_size"), get(hf, "num_heads"), get(hf, "num_layers")
    return Config(family=NAME, task=TASK, n_layers=L, n_heads=h, n_kv_heads=h, d_model=d, d_head=d // h,
                  d_ff=get(hf, "intermediate_size") or 4 * d, vocab_size=get(hf, "vocab_size"),
                  max_positions=get(hf, "max_position_embeddings"), norm_eps=get(hf, "layer_norm_epsilon", 1e-5),
                  positional="learned", causal=True, pre_norm=True,
                  activation=activation(get(hf, "activation_function", "gelu_new")), qkv_bias=False,
                  attn_scale=1.0, windows=windows(hf, L), tie_embeddings=bool(get(hf, "tie_word_embeddings", True)))


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h, L = b.width("hidden_size"), b.heads("num_heads"), b.layers("num_layers")
    ff = b.ff("intermediate_size", optional=True) or 4 * d
    vocab = b.vocab("vocab_size")
    params = b.blocks(L, d, h, h, None, ff, gated=False) + (vocab + b.positions("max_position_embeddings")) * d
    return params + (0 if get(hf, "tie_word_embeddings", True) else vocab * d)


# ---------------------------------------------------------------- weights half
def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    m.put("tok.weight", m.take("wte.weight"))
    m.put("pos.weight", m.take("wpe.weight"))
    for i in range(cfg.n_layers):
        p, o = f"h.{i}.", f"blocks.{i}."
        m.norm(o + "norm1", p + "ln_1")
        m.fused(o + "attn.qkv", [p + f"attn.attention.{n}_proj" for n in "qkv"], bias=False)
        m.linear(o + "attn.out", p + "attn.attention.out_proj")
        m.norm(o + "norm2", p + "ln_2")
        m.linear(o + "mlp.fc_in", p + "mlp.c_fc")
        m.linear(o + "mlp.fc_out", p + "mlp.c_proj")
    m.norm("norm", "ln_f")
    return m.output_head(cfg)
