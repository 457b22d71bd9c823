"""Phi-3: Mistral (a sliding window on every layer where `sliding_window` is set) whose query, key and
value projections are one fused `qkv_proj` ([Q|K|V] rows, as ours) and whose gate and up projections
are one `gate_up_proj` ([gate|up]); rotary on the first `partial_rotary_factor` of each head where
configured. Its long-context rope ("longrope": per-channel short and long factors) is refused."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import llama, mistral

NAME = "phi3"
TASK = "lm"
PREFIXES = llama.PREFIXES
SYNTHETIC = dict(mistral.SYNTHETIC)
size = llama.size


def config(hf, sd: dict) -> Config:
    rope = llama.rope_parameters(hf)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("longrope", "su"):  # transformers reads Phi-3's old "su" as longrope
        raise ValueError(f"rope scaling {kind!r} (Phi-3's per-channel short and long factors) is not supported")
    return mistral.config(hf, sd).replace(family=NAME)


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    return llama.weights(cfg, unfused(cfg, sd))


def unfused(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    """The state dict with Llama's names: qkv_proj split into q_proj, k_proj, v_proj and
    gate_up_proj into gate_proj, up_proj (the rows in order), the rest as it is."""
    q, kv = cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head
    out = {}
    for key, t in sd.items():
        if key.endswith("self_attn.qkv_proj.weight"):
            if t.shape[0] != q + 2 * kv:
                raise ValueError(f"{key} has {t.shape[0]} rows; the config implies {q + 2 * kv}")
            stem = key[: -len("qkv_proj.weight")]
            for name, part in zip("qkv", t.split([q, kv, kv])):
                out[f"{stem}{name}_proj.weight"] = part
        elif key.endswith("mlp.gate_up_proj.weight"):
            if t.shape[0] != 2 * cfg.d_ff:
                raise ValueError(f"{key} has {t.shape[0]} rows; the config implies {2 * cfg.d_ff}")
            stem = key[: -len("gate_up_proj.weight")]
            out[stem + "gate_proj.weight"], out[stem + "up_proj.weight"] = t.chunk(2)
        else:
            out[key] = t
    return out
