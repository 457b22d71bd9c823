"""XLM-RoBERTa (XLMRobertaModel, XLMRobertaForMaskedLM): RoBERTa's architecture with a
multilingual vocabulary; nothing structural differs."""
from __future__ import annotations

from attnviz.core.config import Config
from attnviz.weights.families import roberta

NAME = "xlm-roberta"
TASK = "encoder"
PREFIXES = roberta.PREFIXES
SYNTHETIC = roberta.SYNTHETIC
size, weights = roberta.size, roberta.weights


def config(hf, sd: dict) -> Config:
    return roberta.config(hf, sd).replace(family=NAME)
