"""BEiT (BeitModel and its classifiers): a ViT whose layers add a learned relative position bias
per head to their scores (`Config.rel_pos_bias`, read by the attention module: by 2-D patch
offset, plus three entries for CLS), usually without absolute positions; its query and value
projections have biases, its key none; layer scale on both sub-layers; with mean pooling (the
default) no norm after the last block."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import vit
from attnviz.weights.mapper import Mapper, activation, get, rename

NAME = "beit"
TASK = "vision"
PREFIXES = ("beit.",)
SYNTHETIC = dict(vit.SYNTHETIC, positional="none", rel_pos_bias=True, layer_scale=True, final_norm=False)
image_defaults = vit.image_defaults   # BeitImageProcessor's defaults: 0.5 mean and std
# Checkpoints on disk keep transformers 4's names (as ViT's): rewritten to the new ones first
OLD_BEIT = [(r"attention\.attention\.relative_position_bias\.", "relative_position_bias."),
            (r"^(beit\.)?encoder\.relative_position_bias\.", r"\1shared_position_bias."),
            *vit.OLD_ATTENTION, *vit.OLD_VIT]


def config(hf, sd: dict) -> Config:
    if not (get(hf, "use_relative_position_bias", False) or get(hf, "use_shared_relative_position_bias", False)):
        raise ValueError("a BEiT without a relative position bias (use_relative_position_bias and "
                         "use_shared_relative_position_bias both false) is not supported")
    if get(hf, "layer_scale_init_value", 0.1) == 0 and any(k.endswith("lambda_1") for k in sd):
        raise ValueError("layer_scale_init_value is 0 but the checkpoint has layer-scale weights")
    return vit.vision_config(
        hf, NAME, d_ff=get(hf, "intermediate_size"), norm_eps=get(hf, "layer_norm_eps", 1e-12),
        activation=activation(get(hf, "hidden_act", "gelu")), rel_pos_bias=True,
        positional="learned" if get(hf, "use_absolute_position_embeddings", False) else "none",
        layer_scale=get(hf, "layer_scale_init_value", 0.1) > 0,
        final_norm=not get(hf, "use_mean_pooling", True))


def size(hf, b) -> int:
    d, h, L = b.width("hidden_size"), b.heads("num_attention_heads"), b.layers("num_hidden_layers")
    grid = b.int("image_size", 1, b.MAX_IMAGE_SIDE) // b.int("patch_size", 1, b.MAX_IMAGE_SIDE)
    return vit.vision_size(b, d, b.ff("intermediate_size")) + L * ((2 * grid - 1) ** 2 + 3) * h


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(rename(sd, OLD_BEIT), PREFIXES)
    m.put("cls", m.take("embeddings.cls_token"))
    if cfg.positional == "learned":
        m.put("pos", m.take("embeddings.position_embeddings"))
    m.linear("patch", "embeddings.patch_embeddings.projection")
    shared = "shared_position_bias.relative_position_bias_table"
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        m.norm(o + "norm1", p + "layernorm_before")
        q = p + "attention.q_proj"
        m.put(o + "attn.qkv.weight", torch.cat([m.take(f"{p}attention.{n}_proj.weight") for n in "qkv"]))
        zeros = torch.zeros_like(m.take(q + ".bias"))   # the key projection has no bias
        m.put(o + "attn.qkv.bias", torch.cat([m.take(q + ".bias"), zeros, m.take(p + "attention.v_proj.bias")]))
        m.linear(o + "attn.out", p + "attention.o_proj")
        table = p + "relative_position_bias.relative_position_bias_table"
        m.put(o + "attn.rel_bias", m.take(table if m.has(table) else shared))  # a shared table: each layer's copy
        m.norm(o + "norm2", p + "layernorm_after")
        m.linear(o + "mlp.fc_in", p + "mlp.fc1")
        m.linear(o + "mlp.fc_out", p + "mlp.fc2")
        if cfg.layer_scale:
            m.put(o + "ls1.lambda1", m.take(p + "lambda_1"))
            m.put(o + "ls2.lambda1", m.take(p + "lambda_2"))
    if cfg.final_norm:
        m.norm("norm", "layernorm")
    return m.out
