"""BLIP's image-text matching (BlipForImageTextRetrieval): a ViT vision tower (`vit`: CLS, learned
positions, pre-norm, one fused qkv projection, `post_layernorm` on the hidden states) and a BERT-like
text encoder whose every post-norm layer reads its words both ways, then the image by
cross-attention (the words as queries, the image's tokens as keys and values), then its MLP; a
yes / no head on the first token says whether text and image match. The image-text contrastive
projections beside them are not read (this family shows the matching)."""
from __future__ import annotations

import torch

from attnviz.core.base_model import adopt_state
from attnviz.core.config import Config
from attnviz.core.matcher import Matcher, TextOverImage
from attnviz.core.transformer import Transformer
from attnviz.weights.families import clip, vit
from attnviz.weights.mapper import Mapper, activation, get

NAME = "blip"
TASK = "vision"
SYNTHETIC = dict(vit.SYNTHETIC)
image_defaults = vit.image_defaults   # BlipImageProcessor's (CLIP's) statistics come in preprocessor_config.json


def config(hf, sd: dict) -> tuple[Config, Config]:
    """(the vision tower's config, the text encoder's)."""
    v, t = get(hf, "vision_config"), get(hf, "text_config")
    if get(t, "encoder_hidden_size", get(v, "hidden_size")) != get(v, "hidden_size"):
        raise ValueError("encoder_hidden_size differs from the vision tower's hidden_size; not supported")
    if get(t, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type {get(t, 'position_embedding_type')!r} is not supported")
    d, h = get(t, "hidden_size"), get(t, "num_attention_heads")
    text = Config(family=NAME, task="encoder", n_layers=get(t, "num_hidden_layers"), n_heads=h, n_kv_heads=h,
                  d_model=d, d_head=d // h, d_ff=get(t, "intermediate_size"), vocab_size=get(t, "vocab_size"),
                  max_positions=get(t, "max_position_embeddings"), norm_eps=get(t, "layer_norm_eps", 1e-12),
                  activation=activation(get(t, "hidden_act", "gelu")), embedding_norm=True, final_norm=False)
    return clip.vision_config(v, NAME), text


def size(hf, b) -> int:
    v, t = type(b)(b.folder, get(hf, "vision_config")), type(b)(b.folder, get(hf, "text_config"))
    d = t.width("hidden_size")
    return vit.size(None, v) + 2 * clip.text_size(t) + 2 * d


def weights(cfg: Config, text: Config, sd: dict) -> tuple[dict, dict]:
    """(the vision tower's state, the text encoder's)."""
    v = Mapper(sd, ("vision_model.",))
    v.put("cls", v.take("embeddings.class_embedding"))
    v.put("pos", v.take("embeddings.position_embedding"))
    v.linear("patch", "embeddings.patch_embedding")
    for i in range(cfg.n_layers):
        p, o = f"encoder.layers.{i}.", f"blocks.{i}."
        v.norm(o + "norm1", p + "layer_norm1")
        v.linear(o + "attn.qkv", p + "self_attn.qkv")          # fused already: q | k | v rows
        v.linear(o + "attn.out", p + "self_attn.projection")
        v.norm(o + "norm2", p + "layer_norm2")
        v.linear(o + "mlp.fc_in", p + "mlp.fc1")
        v.linear(o + "mlp.fc_out", p + "mlp.fc2")
    v.norm("norm", "post_layernorm")
    t = Mapper(sd, ("text_encoder.",))
    t.put("tok.weight", t.take("embeddings.word_embeddings.weight"))
    t.put("pos.weight", t.take("embeddings.position_embeddings.weight"))
    t.norm("emb_norm", "embeddings.LayerNorm")
    for i in range(text.n_layers):
        p, o = f"encoder.layer.{i}.", f"blocks.{i}."
        for theirs, ours in (("attention", "self_attn"), ("crossattention", "cross")):
            t.linear(o + ours + ".q", f"{p}{theirs}.self.query")
            t.fused(o + ours + ".kv", [f"{p}{theirs}.self.key", f"{p}{theirs}.self.value"])
            t.linear(o + ours + ".out", f"{p}{theirs}.output.dense")
        t.norm(o + "norm_self", p + "attention.output.LayerNorm")
        t.norm(o + "norm_cross", p + "crossattention.output.LayerNorm")
        t.linear(o + "mlp.fc_in", p + "intermediate.dense")
        t.linear(o + "mlp.fc_out", p + "output.dense")
        t.norm(o + "norm_ffn", p + "output.LayerNorm")
    t.prefix = ""
    t.linear("itm_head", "itm_head")
    return v.out, t.out


def build(cfg: Config, text: Config, sd: dict, key: str, source: str, tokenizer=None, **image) -> Matcher:
    vision, rest = weights(cfg, text, sd)
    net = Transformer.from_state(cfg, vision)
    reader = adopt_state(lambda: TextOverImage(text, cfg.d_model), rest, tied=False)
    info = Matcher.describe(key, cfg, source, net)
    return Matcher(net, info, reader, tokenizer, **{k: v for k, v in image.items() if v is not None})
