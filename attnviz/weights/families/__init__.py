"""The one registry of model families: a family is one file in this folder plus its line in FAMILIES.

A family file says what it is and holds its config half and weights half, pure functions:
- `NAME`: its label (the HF `model_type` for the families transformers knows) and `TASK`: encoder,
  lm, vision or audio build the core `Transformer`; translation builds `Seq2Seq` (a `Seq2SeqModel`);
  speech builds `Whisper` (a `SpeechModel`). Whatever the modules must know about the family's
  structure (post-norm, a norm after the embeddings, the positions...) the config half writes into
  the config's fields: nothing outside this folder branches on a family's name;
- the HF half, where transformers knows the family: `config(hf, sd)`: a transformers config
  (object or dict) -> ours; `weights(cfg, sd)`: an HF state dict -> our state, every tensor through
  the one checked accessor (`attnviz.weights.mapper.Mapper`); `size(hf, bounds)`: the parameters a
  local folder's config implies, each size read through its bounds (`attnviz.weights.folders.Bounds`)
  before anything is allocated; `from_hf(hf_model, tokenizer, key)` where the model is built its own
  way (whisper);
- `SYNTHETIC` (`Transformer` families): the structural fields of a synthetic shape of the family
  (the latency pages' `synthetic:family=...`);
- audio families (wav2vec2, hubert): `feature_extractor(settings)`: transformers' feature extractor
  from a folder's preprocessor_config.json (a dict), or its defaults for None;
- vision families: `image_defaults(cfg) -> (mean, std, side)` for a folder without a
  preprocessor_config.json; a family whose model has more than a vision tower (CLIP, SigLIP's text
  tower) returns (vision config, more parts...) from `config` and builds its model with
  `build(cfg, *parts, sd, key, source, tokenizer, **image settings)`;
- optionally a reader's half: `GGUF_ARCHITECTURE` with `gguf_config` / `gguf_name` / `gguf_tensor` /
  `hf_shapes` (llama), `from_onnx` (dinov2), the Marian `.bin` files (bergamot), CTranslate2 folders
  (whisper, through `ctranslate2.py` here: a reader, not a family).
"""
from __future__ import annotations

import torch

from attnviz.core.config import TASKS, Config
from attnviz.weights.families import (bart, beit, bergamot, bert, blip, bloom, clip, deit, dinov2, falcon, gemma,
                                      gemma2, gemma3_text, gpt2, gpt_neo, gpt_neox, gptj, llama, m2m_100, marian, mbart,
                                      mistral, mixtral, mt5, olmo2, opt, phi, phi3, qwen2, qwen3, qwen3_moe, siglip, t5,
                                      vit, whisper)
from attnviz.weights.families import deberta_v2, distilbert, electra, modernbert, mpnet, roberta, xlm_roberta
from attnviz.weights.families import hubert, wav2vec2
from attnviz.weights.mapper import get

FAMILIES = {f.NAME: f for f in (
    bert,
    gpt2,
    llama,
    mistral,
    mixtral,
    qwen2,
    qwen3,
    qwen3_moe,
    gemma,
    gemma2,
    gemma3_text,
    gpt_neox,
    gptj,
    falcon,
    phi,
    phi3,
    opt,
    gpt_neo,
    bloom,
    olmo2,
    roberta,
    xlm_roberta,
    distilbert,
    electra,
    mpnet,
    modernbert,
    deberta_v2,
    vit,
    dinov2,
    deit,
    beit,
    clip,
    siglip,
    blip,
    marian,
    bart,
    mbart,
    m2m_100,
    t5,
    mt5,
    bergamot,
    whisper,
    wav2vec2,
    hubert,
)}
HF_TASKS = (*TASKS, "translation", "speech")   # every model kind from_hf builds


def family(name):
    """The registered family called `name`; ValueError naming them all."""
    if not isinstance(name, str) or name not in FAMILIES:
        raise ValueError(f"model family {name!r:.40} is not registered; registered: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def reads_hf(f) -> bool:
    """Whether a family has an HF half (transformers configs and state dicts)."""
    return all(hasattr(f, part) for part in ("config", "weights", "size"))


def hf_family(model_type, tasks=HF_TASKS):
    """The family that reads transformers checkpoints of this `model_type` and builds one of `tasks`;
    ValueError naming the supported architectures, the core `Transformer`'s first."""
    f = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if f is not None and reads_hf(f) and f.TASK in tasks:
        return f
    names = [n for n, f in FAMILIES.items() if reads_hf(f) and f.TASK in TASKS and f.TASK in tasks]
    for task in tasks:
        if task not in TASKS:
            names += [f"and for {task} " + ", ".join(n for n, f in FAMILIES.items() if reads_hf(f) and f.TASK == task)]
    raise ValueError(f"architecture {model_type!r:.40} is not supported; supported: {', '.join(names)}")


def gguf_family(architecture):
    """The family that reads GGUF files of this `general.architecture` itself (its GGUF half), or
    None: transformers' GGUF conversion reads the rest (`attnviz.weights.gguf`)."""
    for f in FAMILIES.values():
        if getattr(f, "GGUF_ARCHITECTURE", None) == architecture:
            return f
    return None


def synthetic_preset(name) -> dict:
    """The structural `Config` fields of a synthetic shape of family `name` (no sizes)."""
    presets = {n: f.SYNTHETIC for n, f in FAMILIES.items() if hasattr(f, "SYNTHETIC")}
    if not isinstance(name, str) or name not in presets:
        raise ValueError(f"family must be one of {', '.join(presets)}")
    return dict(presets[name])


def convert(hf_config, state_dict) -> tuple[Config, dict[str, torch.Tensor]]:
    """An HF config and state dict of a core `Transformer` family -> our `Config` and state dict."""
    f = hf_family(get(hf_config, "model_type"), TASKS)
    cfg = f.config(hf_config, state_dict)
    return cfg, f.weights(cfg, state_dict)
