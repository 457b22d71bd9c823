"""Llama (LlamaModel, LlamaForCausalLM; SmolLM2): pre-RMSNorm decoder, rotary positions, grouped
K/V heads, gated SiLU MLP. Read from HF folders and from llama.cpp GGUF files (SmolLM2): the GGUF
half maps llama.cpp names and metadata onto transformers' so both paths share the weights half."""
from __future__ import annotations

import re

import torch

from attnviz.core.config import Config, rope_pairs
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
LAYER_TYPES = {"full_attention": False, "sliding_attention": True}   # -> whether the layer has a window


def rope_parameters(hf) -> dict:
    """The global layers' rope parameters (transformers 5 keeps them per layer type where the
    types differ: Gemma 3)."""
    rope = get(hf, "rope_parameters") or get(hf, "rope_scaling") or {}
    return rope.get("full_attention", rope) if isinstance(rope, dict) else {}


def windows(hf) -> tuple:
    """Each layer's sliding window (0: every key) from `layer_types` and `sliding_window`;
    a layer type we do not implement is refused by name."""
    types = get(hf, "layer_types")
    window = get(hf, "sliding_window")
    if not types:
        return ()
    unknown = sorted({t for t in types if t not in LAYER_TYPES})
    if unknown:
        raise ValueError(f"layer type {unknown[0]!r} is not supported; supported: {', '.join(LAYER_TYPES)}")
    if not window or not any(LAYER_TYPES[t] for t in types):
        return ()
    return tuple(int(window) if LAYER_TYPES[t] else 0 for t in types)


def config(hf, sd: dict) -> Config:
    """Llama's config, and the parent of every decoder family written as its difference."""
    rope = rope_parameters(hf)
    d, h = get(hf, "hidden_size"), get(hf, "num_attention_heads")
    dh = get(hf, "head_dim") or d // h
    partial = rope.get("partial_rotary_factor", get(hf, "partial_rotary_factor", 1.0)) or 1.0
    rotary = int(dh * partial)
    bias = bool(get(hf, "attention_bias", False))
    if get(hf, "pretraining_tp", 1) not in (None, 1):
        raise ValueError("pretraining_tp > 1 (sliced projections) is not supported")
    return Config(family=NAME, task=TASK, n_layers=get(hf, "num_hidden_layers"), n_heads=h,
                  n_kv_heads=get(hf, "num_key_value_heads") or h, d_model=d,
                  d_head=dh, d_ff=get(hf, "intermediate_size"),
                  vocab_size=get(hf, "vocab_size"), max_positions=get(hf, "max_position_embeddings"),
                  norm="rmsnorm", norm_eps=get(hf, "rms_norm_eps", 1e-6), positional="rotary",
                  rope_theta=float(rope.get("rope_theta", get(hf, "rope_theta", 10000.0))),
                  rotary_dim=rotary if rotary < dh else 0, rope_scaling=_scaling(hf, rope), causal=True,
                  pre_norm=True, activation=activation(get(hf, "hidden_act", "silu")), gated_mlp=True,
                  qkv_bias=bias, out_bias=bias, mlp_bias=bool(get(hf, "mlp_bias", False)),
                  windows=windows(hf), tie_embeddings=bool(get(hf, "tie_word_embeddings", False)))


def _scaling(hf, rope: dict) -> tuple:
    scaling = rope_pairs({k: v for k, v in rope.items() if k != "partial_rotary_factor"})
    if dict(scaling).get("rope_type") == "yarn" and "original_max_position_embeddings" not in dict(scaling):
        scaling = tuple(sorted(scaling + (("original_max_position_embeddings",
                                           get(hf, "max_position_embeddings")),)))
    return scaling


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
    experts = b.int("num_local_experts", 1, 1024, optional=True) or b.int("num_experts", 1, 1024, optional=True) or 1
    params = b.blocks(L, d, h, kv, dh, ff, gated=True) + vocab * d
    params += (experts - 1) * L * 3 * d * ff
    return params + (0 if get(hf, "tie_word_embeddings", False) else vocab * d)


# ---------------------------------------------------------------- weights half
def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    """Llama's tensors, and those its children add where their config says so: q/k norms, the
    sandwich norms (Gemma 2/3, OLMo 2 name them post_attention / pre_ and post_feedforward),
    experts (Mixtral, Qwen3-MoE)."""
    m = Mapper(sd, PREFIXES)
    m.put("tok.weight", m.take("embed_tokens.weight"))
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        if cfg.input_norms:
            m.norm(o + "norm1", p + "input_layernorm", bias=False)
        if cfg.output_norms:
            m.norm(o + "norm1_out", p + "post_attention_layernorm", bias=False)
            m.norm(o + "norm2_out", p + "post_feedforward_layernorm", bias=False)
            if cfg.input_norms:
                m.norm(o + "norm2", p + "pre_feedforward_layernorm", bias=False)
        elif not cfg.parallel:
            m.norm(o + "norm2", p + "post_attention_layernorm", bias=False)
        if cfg.qk_norm != "none":  # over each head (Qwen3, Gemma 3) or over the layer's heads (OLMo 2)
            m.norm(o + "attn.q_norm", p + "self_attn.q_norm", bias=False)
            m.norm(o + "attn.k_norm", p + "self_attn.k_norm", bias=False)
        m.fused(o + "attn.qkv", [p + f"self_attn.{n}_proj" for n in "qkv"], bias=cfg.qkv_bias)
        m.linear(o + "attn.out", p + "self_attn.o_proj", bias=cfg.out_bias)
        if cfg.n_experts:
            experts(m, o + "mlp.", p, cfg.n_experts)
        else:
            m.fused(o + "mlp.fc_in", [p + "mlp.gate_proj", p + "mlp.up_proj"], bias=cfg.mlp_bias)
            m.linear(o + "mlp.fc_out", p + "mlp.down_proj", bias=cfg.mlp_bias)
    m.norm("norm", "norm", bias=False)
    return m.output_head(cfg)


def experts(m: Mapper, ours: str, layer: str, n: int):
    """A layer's router and experts, in the layouts checkpoints hold them: transformers 5's fused
    tensors in memory (gate_up_proj [E, 2ff, d], down_proj [E, d, ff]), or per expert on disk
    (Qwen3-MoE's gate/up/down_proj; Mixtral's block_sparse_moe w1 = gate, w3 = up, w2 = down)."""
    if m.has(layer + "block_sparse_moe.gate.weight"):
        theirs, parts = layer + "block_sparse_moe.", ("w1", "w3", "w2")
    else:
        theirs, parts = layer + "mlp.", ("gate_proj", "up_proj", "down_proj")
    m.put(ours + "router.weight", m.take(theirs + "gate.weight"))
    if m.has(theirs + "experts.gate_up_proj"):
        gate_up, down = m.take(theirs + "experts.gate_up_proj"), m.take(theirs + "experts.down_proj")
        if gate_up.shape[0] != n or down.shape[0] != n:
            raise ValueError(f"the checkpoint has {gate_up.shape[0]} experts; its config says {n}")
        for e in range(n):
            m.put(f"{ours}experts.{e}.fc_in.weight", gate_up[e])
            m.put(f"{ours}experts.{e}.fc_out.weight", down[e])
        return
    gate, up, down = parts
    for e in range(n):
        m.fused(f"{ours}experts.{e}.fc_in", [f"{theirs}experts.{e}.{gate}", f"{theirs}experts.{e}.{up}"], bias=False)
        m.linear(f"{ours}experts.{e}.fc_out", f"{theirs}experts.{e}.{down}", bias=False)


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
