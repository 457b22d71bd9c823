"""HuBERT (HubertModel, HubertForCTC): wav2vec 2.0's architecture under its own name, trained on
another target; what differs is that the LayerNorm before the feature projection may be absent
(`feat_proj_layer_norm=False`). A BatchNorm before the positional convolution
(`conv_pos_batch_norm`) is refused by name, as in wav2vec2.py."""
from __future__ import annotations

import torch

from attnviz.core.config import Config
from attnviz.weights.families import wav2vec2
from attnviz.weights.mapper import get

NAME = "hubert"
TASK = wav2vec2.TASK
PREFIXES = ("hubert.",)
size = wav2vec2.size
feature_extractor = wav2vec2.feature_extractor


def config(hf, sd: dict) -> Config:
    return wav2vec2.audio_config(hf, sd, NAME, feature_norm=bool(get(hf, "feat_proj_layer_norm", True)))


def weights(cfg: Config, sd: dict) -> dict[str, torch.Tensor]:
    return wav2vec2.weights(cfg, sd, PREFIXES)
