"""mT5 (MT5ForConditionalGeneration): T5 v1.1's architecture over a multilingual vocabulary; its
decoder output is never scaled before the output layer. Builds `attnviz.core.seq2seq.Seq2Seq`."""
from __future__ import annotations

import torch

from attnviz.core.seq2seq import Seq2SeqConfig
from attnviz.weights.families import t5

NAME = "mt5"
TASK = "translation"


def config(hf, sd: dict) -> Seq2SeqConfig:
    return t5.config(hf, sd, NAME, scaled=False)


def size(hf, b) -> int:
    return t5.size(hf, b)


def weights(cfg: Seq2SeqConfig, sd: dict) -> dict[str, torch.Tensor]:
    return t5.weights(cfg, sd)
