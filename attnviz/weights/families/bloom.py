"""BLOOM (BloomModel, BloomForCausalLM): a pre-norm decoder without position embeddings, positions
as ALiBi score biases per head, a LayerNorm after the token embeddings, tanh-GELU MLPs 4x wide, one
query_key_value projection interleaved per head (reordered at load), tied output embeddings."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.mapper import Mapper, get

NAME = "bloom"
TASK = "lm"
PREFIXES = ("transformer.",)
SYNTHETIC = dict(task=TASK, norm="layernorm", positional="alibi", pre_norm=True, activation="gelu_tanh",
                 causal=True, embedding_norm=True, tie_embeddings=True, norm_eps=1e-5)
# ALiBi has no position table; BLOOM was trained on sequences of this many tokens.
MAX_POSITIONS = 2048


# ---------------------------------------------------------------- config half
def config(hf, sd: dict) -> Config:
    if get(hf, "apply_residual_connection_post_layernorm", False):
        raise ValueError("BLOOM's apply_residual_connection_post_layernorm (the residual taken after the norm) "
                         "is not supported")
    # pretraining_tp / slow_but_exact only split the output products into slices summed in turn:
    # the same sums, so nothing to refuse
    d, h = get(hf, "hidden_size"), get(hf, "n_head") or get(hf, "num_attention_heads")
    return Config(family=NAME, task=TASK, n_layers=get(hf, "n_layer") or get(hf, "num_hidden_layers"),
                  n_heads=h, n_kv_heads=h, d_model=d, d_head=d // h, d_ff=4 * d, vocab_size=get(hf, "vocab_size"),
                  max_positions=get(hf, "seq_length") or MAX_POSITIONS,
                  norm_eps=get(hf, "layer_norm_epsilon", 1e-5), positional="alibi", causal=True, pre_norm=True,
                  activation="gelu_tanh", embedding_norm=True,
                  tie_embeddings=bool(get(hf, "tie_word_embeddings", True)))


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d = b.width("hidden_size")
    h = b.heads("n_head", optional=True) or b.heads("num_attention_heads")
    L = b.layers("n_layer", optional=True) or b.layers("num_hidden_layers")
    vocab = b.vocab("vocab_size")
    params = b.blocks(L, d, h, h, None, 4 * d, gated=False) + vocab * d
    return params + (0 if get(hf, "tie_word_embeddings", True) else vocab * d)


# ---------------------------------------------------------------- weights half
def per_head_to_blocks(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """BLOOM's fused rows [head, (q, k, v), d_head] -> ours [Q of every head | K | V]."""
    return t.reshape(n_heads, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    m.put("tok.weight", m.take("word_embeddings.weight"))
    m.norm("emb_norm", "word_embeddings_layernorm")
    for i in range(cfg.n_layers):
        p, o = f"h.{i}.", f"blocks.{i}."
        m.norm(o + "norm1", p + "input_layernorm")
        for part in ("weight", "bias"):
            m.put(f"{o}attn.qkv.{part}",
                  per_head_to_blocks(m.take(f"{p}self_attention.query_key_value.{part}"), cfg.n_heads))
        m.linear(o + "attn.out", p + "self_attention.dense")
        m.norm(o + "norm2", p + "post_attention_layernorm")
        m.linear(o + "mlp.fc_in", p + "mlp.dense_h_to_4h")
        m.linear(o + "mlp.fc_out", p + "mlp.dense_4h_to_h")
    m.norm("norm", "ln_f")
    return m.output_head(cfg)
