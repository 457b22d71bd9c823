"""SigLIP (SiglipModel): CLIP's two towers (`clip`) with these differences. The vision tower has no
CLS token and no norm after the embeddings, its patch embedding a bias, and its hidden states pass
`post_layernorm`; its pooled token is an attention-pooling head: a learned probe, the only query,
reads every patch (the one attention module, un-fused), then a residual MLP. The text tower is not
causal, pools its last token (captions padded to the positions, as SigLIP was trained) through a
biased linear head. Each caption is scored on its own by a sigmoid, with a learned bias."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.core.dual import DualModel, Joint
from attnviz.weights.families import clip, vit
from attnviz.weights.mapper import Mapper, get

NAME = "siglip"
TASK = "vision"
SYNTHETIC = dict(vit.SYNTHETIC, activation="gelu_tanh", cls_token=False)
image_defaults = vit.image_defaults   # SiglipImageProcessor's defaults: 0.5 mean and std


def config(hf, sd: dict) -> tuple[Config, Joint]:
    v, t = get(hf, "vision_config"), get(hf, "text_config")
    if not get(v, "vision_use_head", True):
        raise ValueError("a SigLIP vision tower without its pooling head (vision_use_head false) is not supported")
    if get(t, "projection_size", get(t, "hidden_size")) != get(t, "hidden_size"):
        raise ValueError("a SigLIP text head of another width than the tower (projection_size) is not supported")
    joint = Joint(text=clip.text_config(t, NAME), text_pool="last",
                  image_pool="probe", score="sigmoid", text_proj_bias=True, pad_text=True)
    return clip.vision_config(v, NAME, cls_token=False), joint


def size(hf, b) -> int:
    v, t = type(b)(b.folder, get(hf, "vision_config")), type(b)(b.folder, get(hf, "text_config"))
    d_v, d_t = v.width("hidden_size"), t.width("hidden_size")
    head = 4 * d_v * d_v + 2 * d_v * v.ff("intermediate_size")   # the pooling head: attention and MLP
    return vit.size(None, v) + clip.text_size(t) + head + d_t * d_t


def weights(cfg: Config, joint: Joint, sd: dict) -> tuple[dict, dict]:
    v = Mapper(sd, ("vision_model.",))
    v.put("pos", v.take("embeddings.position_embedding.weight")[None])
    v.linear("patch", "embeddings.patch_embedding")
    clip.encoder(v, cfg)
    v.norm("norm", "post_layernorm")
    t = clip.text_weights(sd, joint)
    t.linear("text_proj", "head")
    t.prefix = "vision_model.head."
    d = cfg.d_model
    w, b = t.take("attention.in_proj_weight"), t.take("attention.in_proj_bias")   # rows: q | k | v
    t.put("pool.probe", t.take("probe"))
    t.put("pool.attn.q.weight", w[:d])
    t.put("pool.attn.q.bias", b[:d])
    t.put("pool.attn.kv.weight", w[d:])
    t.put("pool.attn.kv.bias", b[d:])
    t.linear("pool.attn.out", "attention.out_proj")
    t.norm("pool.norm", "layernorm")
    t.linear("pool.mlp.fc_in", "mlp.fc1")
    t.linear("pool.mlp.fc_out", "mlp.fc2")
    t.prefix = ""
    t.put("logit_scale", t.take("logit_scale").reshape(()))
    t.put("logit_bias", t.take("logit_bias").reshape(()))
    return v.out, t.out


def build(cfg: Config, joint: Joint, sd: dict, key: str, source: str, tokenizer=None, **image) -> DualModel:
    return clip.build(cfg, joint, sd, key, source, tokenizer, convert=weights, **image)
