"""mBART (MBartForConditionalGeneration, mBART-50): BART made pre-norm — a LayerNorm before each
sub-layer and one more after each side's last layer — with BART's learned positions from row 2 and
its LayerNorm after the embeddings. The target language's token comes first in the target (the
config's `forced_bos_token_id` where it names one). Builds `attnviz.core.seq2seq.Seq2Seq`."""
from __future__ import annotations

import torch

from attnviz.core.seq2seq import Seq2SeqConfig
from attnviz.weights.families import bart, marian
from attnviz.weights.mapper import Mapper

NAME = "mbart"
TASK = "translation"


# ---------------------------------------------------------------- config half
def config(hf, sd: dict) -> Seq2SeqConfig:
    return bart.config(hf, sd, NAME, pre_norm=True)


def size(hf, b) -> int:
    return marian.size(hf, b)


# ---------------------------------------------------------------- weights half
def weights(cfg: Seq2SeqConfig, sd: dict) -> dict[str, torch.Tensor]:
    out = bart.weights(cfg, sd)
    m = Mapper(sd, marian.PREFIXES)
    m.norm("enc_final_norm", "encoder.layer_norm")
    m.norm("dec_final_norm", "decoder.layer_norm")
    return {**out, **m.out}
