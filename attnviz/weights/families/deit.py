"""DeiT (DeiTModel and its classifiers): a ViT with a second learned token, the distillation
token, after CLS; it has a position of its own and, in the distilled checkpoints, a classifier of
its own reading it (here it is a token like CLS: its attention rows are traced and shown)."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import vit
from attnviz.weights.mapper import Mapper, activation, get, rename

NAME = "deit"
TASK = "vision"
PREFIXES = ("deit.",)
SYNTHETIC = dict(vit.SYNTHETIC, distill_token=True)
image_defaults = vit.image_defaults   # DeiTImageProcessor's (ImageNet) statistics come in preprocessor_config.json


def config(hf, sd: dict) -> Config:
    return vit.vision_config(hf, NAME, d_ff=get(hf, "intermediate_size"), norm_eps=get(hf, "layer_norm_eps", 1e-12),
                             activation=activation(get(hf, "hidden_act", "gelu")), distill_token=True)


def size(hf, b) -> int:
    return vit.size(hf, b) + b.width("hidden_size")


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(rename(sd, vit.OLD_ATTENTION + vit.OLD_VIT), PREFIXES)
    vit.embeddings(m)
    m.put("distill", m.take("embeddings.distillation_token"))
    vit.blocks(m, cfg, "layers.", ("layernorm_before", "layernorm_after"), layer_scale=False)
    return m.out
