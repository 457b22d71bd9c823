"""CLIP (CLIPModel): two towers. The vision tower is a ViT (`vit`) with a norm after the embeddings
(`pre_layrnorm`), a patch embedding without bias and QuickGELU; its pooled token is CLS through
`post_layernorm`, which the hidden states do not pass. The text tower is a causal pre-norm encoder
with learned positions, pooled at its end-of-text token. Both pooled tokens are projected and
compared by cosine, the captions' scores softmaxed. SigLIP (`siglip`) is written as its difference."""
from __future__ import annotations

import torch

from attnviz.core.base_model import adopt_state
from attnviz.core.config import Config
from attnviz.core.dual import DualModel, Joint, Towers
from attnviz.core.transformer import Transformer
from attnviz.weights.families import vit
from attnviz.weights.mapper import Mapper, activation, get

NAME = "clip"
TASK = "vision"
SYNTHETIC = dict(vit.SYNTHETIC, activation="quick_gelu", patch_bias=False, embedding_norm=True, final_norm=False)
image_defaults = vit.image_defaults   # CLIP's processor ships its own statistics in preprocessor_config.json
LEGACY_EOS = 2    # configs from before transformers fixed CLIP's eos id: the text pools at its highest id


# ---------------------------------------------------------------- config half
def vision_config(v, family: str, **fields) -> Config:
    return vit.vision_config(v, family, d_ff=get(v, "intermediate_size"), norm_eps=get(v, "layer_norm_eps", 1e-5),
                             activation=activation(get(v, "hidden_act", "quick_gelu")), **fields)


def text_config(t, family: str, **fields) -> Config:
    d, h = get(t, "hidden_size"), get(t, "num_attention_heads")
    return Config(family=family, task="encoder", n_layers=get(t, "num_hidden_layers"), n_heads=h, n_kv_heads=h,
                  d_model=d, d_head=d // h, d_ff=get(t, "intermediate_size"), vocab_size=get(t, "vocab_size"),
                  max_positions=get(t, "max_position_embeddings"), norm_eps=get(t, "layer_norm_eps", 1e-5),
                  pre_norm=True, activation=activation(get(t, "hidden_act", "quick_gelu")), **fields)


def config(hf, sd: dict) -> tuple[Config, Joint]:
    """(the vision tower's config, how the towers meet: the text tower's config among it)."""
    t = get(hf, "text_config")
    eos = get(t, "eos_token_id")
    joint = Joint(text=text_config(t, NAME, causal=True), eos_id=eos if isinstance(eos, int) else 0,
                  text_pool="argmax" if eos == LEGACY_EOS else "eos", proj_dim=get(hf, "projection_dim"))
    return vision_config(get(hf, "vision_config"), NAME, patch_bias=False, embedding_norm=True,
                         final_norm=False), joint


def text_size(b) -> int:
    d = b.width("hidden_size")
    h, L = b.heads("num_attention_heads"), b.layers("num_hidden_layers")
    return b.blocks(L, d, h, h, None, b.ff("intermediate_size"), gated=False) + \
        (b.vocab("vocab_size") + b.positions("max_position_embeddings")) * d


def size(hf, b) -> int:
    """Both towers' parameters, each read through bounds on its own part of the config."""
    v, t = type(b)(b.folder, get(hf, "vision_config")), type(b)(b.folder, get(hf, "text_config"))
    return vit.size(None, v) + text_size(t) + 2 * b.int("projection_dim", 1, b.MAX_D_MODEL) * v.width("hidden_size")


# ---------------------------------------------------------------- weights half
def encoder(m: Mapper, cfg: Config, out: str = ""):
    """A tower's blocks (`encoder.layers.N`, CLIP's and SigLIP's names) into ours under `out`."""
    for i in range(cfg.n_layers):
        p, o = f"encoder.layers.{i}.", f"{out}blocks.{i}."
        m.norm(o + "norm1", p + "layer_norm1")
        m.fused(o + "attn.qkv", [p + f"self_attn.{n}_proj" for n in "qkv"])
        m.linear(o + "attn.out", p + "self_attn.out_proj")
        m.norm(o + "norm2", p + "layer_norm2")
        m.linear(o + "mlp.fc_in", p + "mlp.fc1")
        m.linear(o + "mlp.fc_out", p + "mlp.fc2")


def text_weights(sd: dict, joint: Joint) -> Mapper:
    m = Mapper(sd, ("text_model.",))
    m.put("text.tok.weight", m.take("embeddings.token_embedding.weight"))
    m.put("text.pos.weight", m.take("embeddings.position_embedding.weight"))
    encoder(m, joint.text, "text.")
    m.norm("text.norm", "final_layer_norm")
    return m


def weights(cfg: Config, joint: Joint, sd: dict) -> tuple[dict, dict]:
    """(the vision tower's state, the towers' state)."""
    v = Mapper(sd, ("vision_model.",))
    v.put("cls", v.take("embeddings.class_embedding").view(1, 1, -1))
    v.put("pos", v.take("embeddings.position_embedding.weight")[None])
    v.put("patch.weight", v.take("embeddings.patch_embedding.weight"))
    v.norm("emb_norm", "pre_layrnorm")
    encoder(v, cfg)
    t = text_weights(sd, joint)
    t.prefix = ""                                        # the rest sits beside the towers
    t.norm("post_norm", "vision_model.post_layernorm")
    t.put("visual_proj.weight", t.take("visual_projection.weight"))
    t.put("text_proj.weight", t.take("text_projection.weight"))
    t.put("logit_scale", t.take("logit_scale"))
    return v.out, t.out


def build(cfg: Config, joint: Joint, sd: dict, key: str, source: str, tokenizer=None, *, convert=None,
          **image) -> DualModel:
    """The two-tower model from an HF state dict; `convert`: the family's `weights` (default CLIP's)."""
    vision, rest = (convert or weights)(cfg, joint, sd)
    net = Transformer.from_state(cfg, vision)
    towers = adopt_state(lambda: Towers(cfg, joint), rest, tied=False)
    info = DualModel.describe(key, cfg, source, net)
    return DualModel(net, info, towers, tokenizer, **{k: v for k, v in image.items() if v is not None})
