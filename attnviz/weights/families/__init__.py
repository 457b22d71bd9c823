"""One file per model family; adding a family is one file plus one line in FAMILIES below.

A family file holds a config half and a weights half, both pure functions:
- `NAME`, and `config(hf, sd) -> Config`: a transformers config (object or dict) -> ours;
- `weights(cfg, sd) -> state`: an HF state dict -> ours (`attnviz.core.transformer.Transformer`
  keys), every tensor through the one checked accessor (`attnviz.weights.mapper.Mapper`);
- `size(hf, bounds) -> int`: the parameters a local folder's config implies, each size read
  through its bounds (`attnviz.weights.folders.Bounds`) before anything is allocated;
- vision families: `image_defaults(cfg) -> (mean, std, side)` for a folder without a
  preprocessor_config.json;
- optionally the readers' halves: `GGUF_ARCHITECTURE` with `gguf_config` / `gguf_name` /
  `gguf_tensor` / `hf_shapes` (llama), `from_onnx` (dinov2).
"""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import bart, bert, dinov2, gpt2, llama, marian, vit, whisper
from attnviz.weights.mapper import get

FAMILIES = {f.NAME: f for f in (bert, gpt2, llama, vit, dinov2)}
SEQ2SEQ = {f.NAME: f for f in (marian, bart, whisper)}  # encoder-decoders: build `core.seq2seq.Seq2Seq` (TASK translation;
# whisper: TASK speech, built by its own `from_hf` as a `core.speech.SpeechModel`)
SUPPORTED = tuple(FAMILIES)


def family(name):
    """The family module for an HF `model_type`; ValueError naming the supported ones."""
    if not isinstance(name, str) or name not in FAMILIES:
        raise ValueError(f"architecture {name!r:.40} is not supported; supported: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def gguf_family(architecture):
    """The family that reads GGUF files of this `general.architecture`."""
    for f in FAMILIES.values():
        if getattr(f, "GGUF_ARCHITECTURE", None) == architecture:
            return f
    readable = [f.GGUF_ARCHITECTURE for f in FAMILIES.values() if hasattr(f, "GGUF_ARCHITECTURE")]
    raise ValueError(f"GGUF architecture is {architecture!r}; only {', '.join(map(repr, readable))} "
                     "GGUF files are supported.")


def convert(hf_config, state_dict) -> tuple[Config, dict[str, torch.Tensor]]:
    """An HF config and state dict -> our `Config` and `Transformer` state dict."""
    f = family(get(hf_config, "model_type"))
    cfg = f.config(hf_config, state_dict)
    return cfg, f.weights(cfg, state_dict)
