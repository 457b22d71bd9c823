"""BART (BartForConditionalGeneration): Marian's post-norm encoder-decoder layout with learned
positions (the table starts at row 2), a LayerNorm after the embeddings on both sides, and
unscaled embeddings unless `scale_embedding`. Builds `attnviz.core.seq2seq.Seq2Seq`."""
from __future__ import annotations

import torch

from attnviz.core.seq2seq import Seq2SeqConfig
from attnviz.weights.families import marian
from attnviz.weights.mapper import Mapper, get

NAME = "bart"
TASK = "translation"
POSITION_OFFSET = 2   # BartLearnedPositionalEmbedding: a fairseq legacy, rows 0-1 are never used


# ---------------------------------------------------------------- config half
def config(hf, sd: dict, family: str = NAME, pre_norm: bool = False) -> Seq2SeqConfig:
    """BART's; mBART's with `pre_norm`."""
    if not pre_norm:
        marian.post_norm_only(hf)
    start = get(hf, "decoder_start_token_id")
    return Seq2SeqConfig.of(marian.blocks(hf, family, pre_norm), positional="learned", position_offset=POSITION_OFFSET,
                            embedding_norm=True, decoder_start_id=get(hf, "eos_token_id") if start is None else start,
                            **marian.shape(hf))


def size(hf, b) -> int:
    return marian.size(hf, b)


# ---------------------------------------------------------------- weights half
def weights(cfg: Seq2SeqConfig, sd: dict) -> dict[str, torch.Tensor]:
    m = Mapper(sd, marian.PREFIXES)
    marian.layers(m, cfg)
    m.put("enc_pos.weight", m.take("encoder.embed_positions.weight"))
    m.put("dec_pos.weight", m.take("decoder.embed_positions.weight"))
    m.norm("enc_emb_norm", "encoder.layernorm_embedding")
    m.norm("dec_emb_norm", "decoder.layernorm_embedding")
    return m.out
