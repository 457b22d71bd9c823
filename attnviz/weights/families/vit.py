"""ViT (ViTModel and its task variants): pre-norm encoder over image patches, CLS token, learned
positions. The patch embedding and the block layout are shared with DINOv2 (`embeddings`,
`blocks`, `vision_config` below)."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.mapper import Mapper, activation, get, rename

NAME = "vit"
TASK = "vision"
PREFIXES = ("vit.",)
# A synthetic shape of this family (`attnviz.latency.results.parse_synthetic`): the structure, no sizes.
SYNTHETIC = dict(task=TASK, pre_norm=True, positional="learned", image_size=224, patch_size=16)

# transformers 5 renamed the vision models' tensors (`attention.q_proj` instead of
# `attention.attention.query`, ViT's `layers.N` instead of `encoder.layer.N`); checkpoints on disk
# keep the older names. Both are rewritten to the new ones before mapping.
OLD_ATTENTION = [
    (r"attention\.attention\.query\.", "attention.q_proj."),
    (r"attention\.attention\.key\.", "attention.k_proj."),
    (r"attention\.attention\.value\.", "attention.v_proj."),
    (r"attention\.output\.dense\.", "attention.o_proj."),
]
OLD_VIT = [(r"^(vit\.)?encoder\.layer\.(\d+)\.", r"\1layers.\2."),
           (r"\.intermediate\.dense\.", ".mlp.fc1."), (r"\.output\.dense\.", ".mlp.fc2.")]


# ---------------------------------------------------------------- shared with DINOv2
def vision_config(hf, family: str, **extra) -> Config:
    d, h = get(hf, "hidden_size"), get(hf, "num_attention_heads")
    size, patch = get(hf, "image_size"), get(hf, "patch_size")
    prefix = int(extra.get("cls_token", True)) + int(extra.get("distill_token", False))
    extra = {"positional": "learned", **extra}
    return Config(family=family, task=TASK, n_layers=get(hf, "num_hidden_layers"), n_heads=h, n_kv_heads=h,
                  d_model=d, d_head=d // h, max_positions=prefix + (size // patch) ** 2,
                  pre_norm=True, qkv_bias=bool(get(hf, "qkv_bias", True)), image_size=size,
                  patch_size=patch, n_channels=get(hf, "num_channels", 3), **extra)


def vision_size(b, d: int, ff: int) -> int:
    """Parameters of a ViT-style encoder of width `d` (read through the folder's bounds `b`)."""
    h, L = b.heads("num_attention_heads"), b.layers("num_hidden_layers")
    params = b.blocks(L, d, h, h, None, ff, gated=False)
    side = b.int("image_size", 1, b.MAX_IMAGE_SIDE)
    patch = b.int("patch_size", 1, side)
    channels = b.int("num_channels", 1, b.MAX_CHANNELS, default=3)
    return params + channels * patch * patch * d + (1 + (side // patch) ** 2) * d


def embeddings(m: Mapper):
    m.put("cls", m.take("embeddings.cls_token"))
    m.put("pos", m.take("embeddings.position_embeddings"))
    m.linear("patch", "embeddings.patch_embeddings.projection")


def blocks(m: Mapper, cfg: Config, layer_prefix: str, norms: tuple[str, str], layer_scale: bool):
    for i in range(cfg.n_layers):
        p, o = f"{layer_prefix}{i}.", f"blocks.{i}."
        m.norm(o + "norm1", p + norms[0])
        m.fused(o + "attn.qkv", [p + f"attention.{n}_proj" for n in "qkv"], bias=cfg.qkv_bias)
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


# ---------------------------------------------------------------- config half
def image_defaults(cfg: Config) -> tuple[tuple, tuple, int]:
    """(mean, std, input side) when a folder has no preprocessor_config.json: ViTImageProcessor's."""
    return (0.5,) * 3, (0.5,) * 3, cfg.image_size


def config(hf, sd: dict) -> Config:
    return vision_config(hf, NAME, d_ff=get(hf, "intermediate_size"),
                         norm_eps=get(hf, "layer_norm_eps", 1e-12),
                         activation=activation(get(hf, "hidden_act", "gelu")))


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d = b.width("hidden_size")
    return vision_size(b, d, b.ff("intermediate_size"))


# ---------------------------------------------------------------- weights half
def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(rename(sd, OLD_ATTENTION + OLD_VIT), PREFIXES)
    embeddings(m)
    blocks(m, cfg, "layers.", ("layernorm_before", "layernorm_after"), layer_scale=False)
    return m.out
