"""HF state dicts -> ours: one small pure function per family (TransformerLens style).

Each converter takes a transformers config (object or dict) and an HF state dict and returns our
`Config` and a state dict for `model.Transformer`. Q, K and V are concatenated into one fused
projection; GPT-2's Conv1D weights are transposed. Missing or misshapen tensors raise ValueError.
"""
from __future__ import annotations

import re
from typing import Callable

import torch

from attnviz.core.config import Config

SUPPORTED = ("bert", "gpt2", "llama", "vit", "dinov2")
ACT = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
       "silu": "silu", "swish": "silu", "relu": "relu"}


def _get(cfg, name, default=None):
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


def _act(name) -> str:
    if name not in ACT:
        raise ValueError(f"activation {name!r} is not supported; supported: {', '.join(ACT)}")
    return ACT[name]


class _Mapper:
    """Moves tensors from an HF state dict to ours, checking that each one exists."""

    def __init__(self, sd: dict, prefixes: tuple[str, ...]):
        self.sd, self.out = sd, {}
        self.prefix = next((p for p in prefixes if any(k.startswith(p) for k in sd)), "")

    def take(self, key: str) -> torch.Tensor:
        full = self.prefix + key
        if full not in self.sd:
            raise ValueError(f"checkpoint is missing tensor {full!r}; is it a complete "
                             "checkpoint of this architecture?")
        return self.sd[full].float()

    def has(self, key: str) -> bool:
        return self.prefix + key in self.sd

    def put(self, ours: str, tensor: torch.Tensor):
        self.out[ours] = tensor.contiguous()

    def linear(self, ours: str, theirs: str, bias=True, transpose=False):
        w = self.take(theirs + ".weight")
        self.put(ours + ".weight", w.t() if transpose else w)
        if bias:
            self.put(ours + ".bias", self.take(theirs + ".bias"))

    def fused(self, ours: str, parts: list[str], bias=True):
        self.put(ours + ".weight", torch.cat([self.take(p + ".weight") for p in parts]))
        if bias:
            self.put(ours + ".bias", torch.cat([self.take(p + ".bias") for p in parts]))

    def norm(self, ours: str, theirs: str, bias=True):
        self.linear(ours, theirs, bias=bias)


def bert(hf, sd):
    if _get(hf, "position_embedding_type", "absolute") not in ("absolute", None):
        raise ValueError("only absolute position embeddings are supported for BERT checkpoints")
    d, h = _get(hf, "hidden_size"), _get(hf, "num_attention_heads")
    m = _Mapper(sd, ("bert.",))
    mlm = any(k.startswith("cls.predictions.transform") for k in sd)
    cfg = Config(family="bert", n_layers=_get(hf, "num_hidden_layers"), n_heads=h, n_kv_heads=h,
                 d_model=d, d_head=d // h, d_ff=_get(hf, "intermediate_size"),
                 vocab_size=_get(hf, "vocab_size"), max_positions=_get(hf, "max_position_embeddings"),
                 norm_eps=_get(hf, "layer_norm_eps", 1e-12), positional="learned",
                 activation=_act(_get(hf, "hidden_act", "gelu")), pre_norm=False,
                 type_vocab_size=_get(hf, "type_vocab_size", 0), final_norm=False,
                 mlm_head=mlm, tie_embeddings=mlm)
    m.put("tok.weight", m.take("embeddings.word_embeddings.weight"))
    m.put("pos.weight", m.take("embeddings.position_embeddings.weight"))
    if cfg.type_vocab_size:
        m.put("types.weight", m.take("embeddings.token_type_embeddings.weight"))
    m.norm("emb_norm", "embeddings.LayerNorm")
    for i in range(cfg.n_layers):
        p, o = f"encoder.layer.{i}.", f"blocks.{i}."
        m.fused(o + "attn.qkv", [p + f"attention.self.{n}" for n in ("query", "key", "value")])
        m.linear(o + "attn.out", p + "attention.output.dense")
        m.norm(o + "norm1", p + "attention.output.LayerNorm")
        m.linear(o + "mlp.fc_in", p + "intermediate.dense")
        m.linear(o + "mlp.fc_out", p + "output.dense")
        m.norm(o + "norm2", p + "output.LayerNorm")
    if mlm:
        m.prefix = ""
        m.linear("mlm_transform", "cls.predictions.transform.dense")
        m.norm("mlm_norm", "cls.predictions.transform.LayerNorm")
        m.put("lm_head.bias", m.take("cls.predictions.bias"))
    return cfg, m.out


def gpt2(hf, sd):
    if _get(hf, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError("GPT-2 checkpoints with scale_attn_by_inverse_layer_idx are not supported")
    d, h = _get(hf, "n_embd"), _get(hf, "n_head")
    m = _Mapper(sd, ("transformer.",))
    cfg = Config(family="gpt2", n_layers=_get(hf, "n_layer"), n_heads=h, n_kv_heads=h, d_model=d,
                 d_head=d // h, d_ff=_get(hf, "n_inner") or 4 * d, vocab_size=_get(hf, "vocab_size"),
                 max_positions=_get(hf, "n_positions"), norm_eps=_get(hf, "layer_norm_epsilon", 1e-5),
                 positional="learned", causal=True, pre_norm=True,
                 activation=_act(_get(hf, "activation_function", "gelu_new")), tie_embeddings=True)
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
    return cfg, m.out


def llama(hf, sd):
    rope = _get(hf, "rope_parameters") or _get(hf, "rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"rope scaling {rope.get('rope_type')!r} is not supported; only the default RoPE")
    d, h = _get(hf, "hidden_size"), _get(hf, "num_attention_heads")
    kv = _get(hf, "num_key_value_heads") or h
    dh = _get(hf, "head_dim") or d // h
    bias, mlp_bias = bool(_get(hf, "attention_bias", False)), bool(_get(hf, "mlp_bias", False))
    m = _Mapper(sd, ("model.",))
    tied = bool(_get(hf, "tie_word_embeddings", False))
    cfg = Config(family="llama", n_layers=_get(hf, "num_hidden_layers"), n_heads=h, n_kv_heads=kv,
                 d_model=d, d_head=dh, d_ff=_get(hf, "intermediate_size"), vocab_size=_get(hf, "vocab_size"),
                 max_positions=_get(hf, "max_position_embeddings"), norm="rmsnorm",
                 norm_eps=_get(hf, "rms_norm_eps", 1e-6), positional="rotary",
                 rope_theta=float(rope.get("rope_theta", _get(hf, "rope_theta", 10000.0))), causal=True,
                 pre_norm=True, activation=_act(_get(hf, "hidden_act", "silu")), gated_mlp=True,
                 qkv_bias=bias, out_bias=bias, mlp_bias=mlp_bias, tie_embeddings=tied)
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
    if not tied:
        m.prefix = ""
        m.put("lm_head.weight", m.take("lm_head.weight"))
    return cfg, m.out


# transformers 5 renamed the vision models' tensors (`attention.q_proj` instead of
# `attention.attention.query`, ViT's `layers.N` instead of `encoder.layer.N`); checkpoints on disk
# keep the older names. Both are rewritten to the new ones before mapping.
_OLD_ATTENTION = [
    (r"attention\.attention\.query\.", "attention.q_proj."),
    (r"attention\.attention\.key\.", "attention.k_proj."),
    (r"attention\.attention\.value\.", "attention.v_proj."),
    (r"attention\.output\.dense\.", "attention.o_proj."),
]
_OLD_VIT = [(r"^(vit\.)?encoder\.layer\.(\d+)\.", r"\1layers.\2."),
            (r"\.intermediate\.dense\.", ".mlp.fc1."), (r"\.output\.dense\.", ".mlp.fc2.")]
_OLD_DINOV2 = [(r"\.mlp\.weights_out\.", ".mlp.down_proj.")]


def _rename(sd: dict, rules) -> dict:
    out = {}
    for key, value in sd.items():
        for pattern, repl in rules:
            key = re.sub(pattern, repl, key)
        out[key] = value
    return out


def _split_swiglu(sd: dict) -> dict:
    """Older DINOv2 checkpoints fuse gate and up as `mlp.weights_in` (gate first)."""
    out = {}
    for key, value in sd.items():
        if ".mlp.weights_in." in key:
            gate, up = value.chunk(2, dim=0)
            out[key.replace("weights_in", "gate_proj")] = gate
            out[key.replace("weights_in", "up_proj")] = up
        else:
            out[key] = value
    return out


def _vision_embeddings(m: _Mapper):
    m.put("cls", m.take("embeddings.cls_token"))
    m.put("pos", m.take("embeddings.position_embeddings"))
    m.linear("patch", "embeddings.patch_embeddings.projection")


def _vision_blocks(m: _Mapper, cfg: Config, layer_prefix: str, norms: tuple[str, str], qkv_bias: bool,
                   layer_scale: bool):
    for i in range(cfg.n_layers):
        p, o = f"{layer_prefix}{i}.", f"blocks.{i}."
        m.norm(o + "norm1", p + norms[0])
        m.fused(o + "attn.qkv", [p + f"attention.{n}_proj" for n in "qkv"], bias=qkv_bias)
        m.linear(o + "attn.out", p + "attention.o_proj")
        m.norm(o + "norm2", p + norms[1])
        if cfg.gated_mlp:
            m.fused(o + "mlp.fc_in", [p + "mlp.gate_proj", p + "mlp.up_proj"])
            m.linear(o + "mlp.fc_out", p + "mlp.down_proj")
        else:
            m.linear(o + "mlp.fc_in", p + "mlp.fc1")
            m.linear(o + "mlp.fc_out", p + "mlp.fc2")
        if layer_scale:
            m.put(o + "ls1.lambda1", m.take(p + "layer_scale1.lambda1"))
            m.put(o + "ls2.lambda1", m.take(p + "layer_scale2.lambda1"))
    m.norm("norm", "layernorm")


def _vision_config(hf, family: str, **extra) -> Config:
    d, h = _get(hf, "hidden_size"), _get(hf, "num_attention_heads")
    size, patch = _get(hf, "image_size"), _get(hf, "patch_size")
    return Config(family=family, n_layers=_get(hf, "num_hidden_layers"), n_heads=h, n_kv_heads=h,
                  d_model=d, d_head=d // h, max_positions=1 + (size // patch) ** 2, positional="learned",
                  pre_norm=True, qkv_bias=bool(_get(hf, "qkv_bias", True)), image_size=size,
                  patch_size=patch, n_channels=_get(hf, "num_channels", 3), **extra)


def vit(hf, sd):
    m = _Mapper(_rename(sd, _OLD_ATTENTION + _OLD_VIT), ("vit.",))
    cfg = _vision_config(hf, "vit", d_ff=_get(hf, "intermediate_size"),
                         norm_eps=_get(hf, "layer_norm_eps", 1e-12),
                         activation=_act(_get(hf, "hidden_act", "gelu")))
    _vision_embeddings(m)
    _vision_blocks(m, cfg, "layers.", ("layernorm_before", "layernorm_after"), cfg.qkv_bias, False)
    return cfg, m.out


def dinov2(hf, sd):
    m = _Mapper(_split_swiglu(_rename(sd, _OLD_ATTENTION + _OLD_DINOV2)), ("dinov2.",))
    swiglu = bool(_get(hf, "use_swiglu_ffn", False))
    d_ff = m.take("encoder.layer.0." + ("mlp.up_proj" if swiglu else "mlp.fc1") + ".weight").shape[0]
    cfg = _vision_config(hf, "dinov2", d_ff=d_ff, norm_eps=_get(hf, "layer_norm_eps", 1e-6),
                         activation="silu" if swiglu else _act(_get(hf, "hidden_act", "gelu")),
                         gated_mlp=swiglu, layer_scale=True)
    _vision_embeddings(m)
    _vision_blocks(m, cfg, "encoder.layer.", ("norm1", "norm2"), cfg.qkv_bias, True)
    return cfg, m.out


CONVERTERS: dict[str, Callable] = {"bert": bert, "gpt2": gpt2, "llama": llama, "vit": vit, "dinov2": dinov2}


def convert(hf_config, state_dict) -> tuple[Config, dict[str, torch.Tensor]]:
    family = _get(hf_config, "model_type")
    if family not in CONVERTERS:
        raise ValueError(f"architecture {family!r} is not supported; supported: {', '.join(SUPPORTED)}")
    return CONVERTERS[family](hf_config, state_dict)
