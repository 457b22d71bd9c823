"""M2M100 (M2M100ForConditionalGeneration: M2M-100 and the NLLB-200 dense models): Marian's layout
made pre-norm — a LayerNorm before each sub-layer and one more after each side's last layer — with
fairseq's sinusoidal positions (Marian's own frequency step, sin | cos halves) counted from
`pad + 1`, no LayerNorm after the embeddings, and no output bias. The source starts with its
language's token (the tokenizer writes it) and the target's language token is forced as the first
target token. Builds `attnviz.core.seq2seq.Seq2Seq`."""
from __future__ import annotations

import torch

from attnviz.core.seq2seq import Seq2SeqConfig
from attnviz.weights.families import marian
from attnviz.weights.mapper import Mapper, get

NAME = "m2m_100"
TASK = "translation"


# ---------------------------------------------------------------- config half
def config(hf, sd: dict) -> Seq2SeqConfig:
    if get(hf, "d_model") % 2:
        raise ValueError("M2M100 checkpoints of an odd width (a zero channel after the sinusoid) are not supported")
    start = get(hf, "decoder_start_token_id")
    return Seq2SeqConfig.of(marian.blocks(hf, NAME, pre_norm=True), positional="marian",
                            position_offset=get(hf, "pad_token_id") + 1,   # fairseq counts positions after pad
                            decoder_start_id=get(hf, "eos_token_id") if start is None else start, **marian.shape(hf))


def size(hf, b) -> int:
    return marian.size(hf, b)


# ---------------------------------------------------------------- weights half
def weights(cfg: Seq2SeqConfig, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, marian.PREFIXES)
    marian.layers(m, cfg)  # positions are computed (sinusoidal), never read from the checkpoint
    m.norm("enc_final_norm", "encoder.layer_norm")
    m.norm("dec_final_norm", "decoder.layer_norm")
    return m.out
