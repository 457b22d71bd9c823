"""Llama (LlamaModel, LlamaForCausalLM; SmolLM2): pre-RMSNorm decoder, rotary positions, grouped
K/V heads, gated SiLU MLP. Read from HF folders and from llama.cpp GGUF files (SmolLM2): the GGUF
half maps llama.cpp names and metadata onto transformers' so both paths share the weights half."""
from __future__ import annotations

import re

import torch

from attnviz.core.config import Config
from attnviz.weights.mapper import Mapper, activation, get

NAME = "llama"
TASK = "lm"
PREFIXES = ("model.",)
# A synthetic shape of this family (`attnviz.latency.results.parse_synthetic`): the structure, no sizes.
SYNTHETIC = dict(task=TASK, norm="rmsnorm", positional="rotary", pre_norm=True, activation="silu",
                 gated_mlp=True, causal=True, qkv_bias=False, out_bias=False, mlp_bias=False,
                 tie_embeddings=True, norm_eps=1e-5)
GGUF_ARCHITECTURE = "llama"


# ---------------------------------------------------------------- config half
def config(hf, sd: dict) -> Config:
    rope = get(hf, "rope_parameters") or get(hf, "rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"rope scaling {rope.get('rope_type')!r} is not supported; only the default RoPE")
    d, h = get(hf, "hidden_size"), get(hf, "num_attention_heads")
    bias = bool(get(hf, "attention_bias", False))
    return Config(family=NAME, task=TASK, n_layers=get(hf, "num_hidden_layers"), n_heads=h,
                  n_kv_heads=get(hf, "num_key_value_heads") or h, d_model=d,
                  d_head=get(hf, "head_dim") or d // h, d_ff=get(hf, "intermediate_size"),
                  vocab_size=get(hf, "vocab_size"), max_positions=get(hf, "max_position_embeddings"),
                  norm="rmsnorm", norm_eps=get(hf, "rms_norm_eps", 1e-6), positional="rotary",
                  rope_theta=float(rope.get("rope_theta", get(hf, "rope_theta", 10000.0))), causal=True,
                  pre_norm=True, activation=activation(get(hf, "hidden_act", "silu")), gated_mlp=True,
                  qkv_bias=bias, out_bias=bias, mlp_bias=bool(get(hf, "mlp_bias", False)),
                  tie_embeddings=bool(get(hf, "tie_word_embeddings", False)))


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h, L = b.width("hidden_size"), b.heads("num_attention_heads"), b.layers("num_hidden_layers")
    ff = b.ff("intermediate_size")
    vocab = b.vocab("vocab_size")
    b.positions("max_position_embeddings")  # rotary: no table, but the bound still applies
    kv = b.int("num_key_value_heads", 1, h, optional=True) or h
    if h % kv:
        raise b.fail(f"config.json: num_attention_heads ({h}) must be a multiple of num_key_value_heads ({kv})")
    dh = b.int("head_dim", 1, b.MAX_D_HEAD, optional=True)
    params = b.blocks(L, d, h, kv, dh, ff, gated=True) + vocab * d
    return params + (0 if get(hf, "tie_word_embeddings", False) else vocab * d)


# ---------------------------------------------------------------- weights half
def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, PREFIXES)
    bias, mlp_bias = cfg.qkv_bias, cfg.mlp_bias
    m.put("tok.weight", m.take("embed_tokens.weight"))
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        m.norm(o + "norm1", p + "input_layernorm", bias=False)
        m.fused(o + "attn.qkv", [p + f"self_attn.{n}_proj" for n in "qkv"], bias=bias)
        m.linear(o + "attn.out", p + "self_attn.o_proj", bias=bias)
        m.norm(o + "norm2", p + "post_attention_layernorm", bias=False)
        m.fused(o + "mlp.fc_in", [p + "mlp.gate_proj", p + "mlp.up_proj"], bias=mlp_bias)
        m.linear(o + "mlp.fc_out", p + "mlp.down_proj", bias=mlp_bias)
    m.norm("norm", "norm", bias=False)
    if not cfg.tie_embeddings:
        m.prefix = ""  # the output head sits beside the base model
        m.put("lm_head.weight", m.take("lm_head.weight"))
    return m.out


# ---------------------------------------------------------------- GGUF (llama.cpp) -> HF names
GGUF_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",  # absent when embeddings are tied (SmolLM2)
}
GGUF_LAYER = {  # `blk.{i}.<part>.weight` -> `model.layers.{i}.<HF part>.weight`
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GGUF_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def gguf_name(name: str) -> str:
    """llama.cpp tensor name -> transformers' LlamaForCausalLM name."""
    if name in GGUF_GLOBAL:
        return GGUF_GLOBAL[name]
    match = _GGUF_LAYER_NAME.fullmatch(name)
    if match is None or match.group(2) not in GGUF_LAYER:
        raise ValueError(f"GGUF tensor {name!r} has no HF llama equivalent; is this a llama GGUF?")
    layer, part = match.groups()
    return f"model.layers.{layer}.{GGUF_LAYER[part]}.weight"


def unpermute_rotary_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (same as transformers' LlamaTensorProcessor).

    llama.cpp's converter reorders each head's rows from HF's "rotate half" layout (pairs
    (j, j + d/2)) to interleaved pairs (2j, 2j + 1); swapping the two middle axes back restores HF.
    """
    rows, cols = weight.shape
    half_head = rows // n_heads // 2
    # (rows, cols) -> (heads, half, 2, cols) -> swap -> (heads, 2, half, cols) -> (rows, cols)
    return weight.reshape(n_heads, half_head, 2, cols).transpose(1, 2).reshape(rows, cols)


def gguf_tensor(hf_name: str, weight: torch.Tensor, cfg: dict) -> torch.Tensor:
    """A dequantised GGUF tensor in HF's layout (Q and K rows un-permuted)."""
    if hf_name.endswith("q_proj.weight"):
        return unpermute_rotary_rows(weight, cfg["num_attention_heads"])
    if hf_name.endswith("k_proj.weight"):
        return unpermute_rotary_rows(weight, cfg["num_key_value_heads"])
    return weight


def gguf_config(meta, has_output_weight: bool) -> dict:
    """GGUF metadata -> an HF config dict (`LlamaConfig(**cfg)` works). `meta(key, default)` reads
    one metadata field."""
    def need(key: str, default=None):
        value = meta(f"llama.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks 'llama.{key}'; the file is incomplete.")
        return value

    hidden = int(need("embedding_length"))
    n_heads = int(need("attention.head_count"))
    vocab = meta("llama.vocab_size")
    if vocab is None:  # older converters only store the token list
        vocab = len(meta("tokenizer.ggml.tokens", []))
    return {
        "model_type": NAME,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(need("attention.head_count_kv", n_heads)),
        "head_dim": int(need("rope.dimension_count", hidden // n_heads)),
        "hidden_act": "silu",
        "max_position_embeddings": int(need("context_length")),
        # Kept as stored (float32 1e-5 = 9.99999974e-06), exactly what transformers' GGUF path uses.
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        # transformers 5 keeps rope settings in `rope_parameters` (it still accepts `rope_theta`).
        "rope_parameters": {"rope_type": "default", "rope_theta": float(need("rope.freq_base"))},
        "tie_word_embeddings": not has_output_weight,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": meta("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta("tokenizer.ggml.padding_token_id"),
    }


def hf_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of `LlamaForCausalLM(LlamaConfig(**cfg))` and its shape (no lm_head when tied)."""
    d, ff, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q_rows, kv_rows = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], d), "model.norm.weight": (d,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (cfg["vocab_size"], d)
    per_layer = {
        "input_layernorm": (d,), "post_attention_layernorm": (d,),
        "self_attn.q_proj": (q_rows, d), "self_attn.k_proj": (kv_rows, d),
        "self_attn.v_proj": (kv_rows, d), "self_attn.o_proj": (d, q_rows),
        "mlp.gate_proj": (ff, d), "mlp.up_proj": (ff, d), "mlp.down_proj": (d, ff),
    }
    for i in range(cfg["num_hidden_layers"]):
        for part, shape in per_layer.items():
            shapes[f"model.layers.{i}.{part}.weight"] = shape
    return shapes
