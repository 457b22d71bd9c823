"""Firefox Translations (Bergamot) Marian students: the family, with its reader of Marian's `.bin`.

The file (Marian's binary model format): an 8-byte version and an
8-byte item count; per item four little-endian 8-byte values (name length, type, shape rank, data
length); all names (NUL-padded); all shapes (4-byte ints); an 8-byte padding length and the padding;
then every item's data in order. Type 0x404 is float32; type 0x4101 is an int8 matrix followed by
one float32 scale (weight = int8 / scale), stored transposed except the embeddings. Numpy alone
reads it; nothing in it is executed.

The converter (config half, weights half) maps Marian's names onto `attnviz.core.seq2seq`: a
post-norm encoder, an SSRU decoder with cross-attention and no self-attention, tied output with bias.
"""
from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from attnviz.core.seq2seq import Seq2SeqConfig
from attnviz.core.translation_parts import Shortlist
from attnviz.core.translator import Seq2SeqModel

NAME = "bergamot"
TASK = "translation"   # a `Seq2Seq` with an SSRU decoder; no HF half: read from Marian's `.bin` only
FLOAT32, INT8, TEXT = 0x404, 0x4101, 0x101  # TEXT: `special:model.yml`, the training config
MAX_ITEMS = 10_000             # a tiny student holds ~200; more is not a Marian model
MAX_FILE_BYTES = 2 * 2**30     # far above the 17 MB students; stops a hostile size before reading
ACTIVATION_SCALE = "_QuantMultA"  # int8 GEMM activation scales: float inference needs none


def _fail(name: str, what: str) -> ValueError:
    return ValueError(f"{name}: {what}; it is not a Bergamot/Marian .bin model")


def read_bin(path: str | Path, name: str | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(weights, options): every weight of a Marian `.bin` as float32, in Marian's own orientation
    (`x @ W`): a linear weight is [in, out], a bias [1, out], `Wemb` [vocab, d]; activation scales
    are dropped. `options`: the top-level `key: value` lines of the embedded `special:model.yml`."""
    path = Path(path)
    name = name or path.name
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise _fail(name, f"the file is {size:,} bytes")
    data = np.fromfile(path, dtype=np.uint8)
    if data.size < 16:
        raise _fail(name, "the file is shorter than its header")
    version, count = (int(v) for v in data[:16].view("<u8"))
    if not 0 < count <= MAX_ITEMS:
        raise _fail(name, f"the header claims {count:,} items")
    pos = 16 + 32 * count
    if data.size < pos:
        raise _fail(name, "the item table is cut short")
    table = data[16:pos].view("<u8").reshape(count, 4).astype(np.int64)  # (name len, type, rank, bytes)
    if (table < 0).any() or table[:, 0].sum() + 4 * table[:, 2].sum() > data.size:
        raise _fail(name, "the item table is inconsistent")
    names = []
    for n_chars in table[:, 0]:
        names.append(bytes(data[pos:pos + n_chars]).rstrip(b"\0").decode("utf-8", "replace"))
        pos += int(n_chars)
    shapes = []
    for rank in table[:, 2]:
        shapes.append(tuple(int(s) for s in data[pos:pos + 4 * rank].view("<i4")))
        pos += 4 * int(rank)
    if pos + 8 > data.size:
        raise _fail(name, "the padding length is missing")
    pos += 8 + int(data[pos:pos + 8].view("<u8")[0])
    out, options = {}, {}
    for item, shape, (_, kind, _, n_bytes) in zip(names, shapes, table):
        stop = pos + int(n_bytes)
        if stop > data.size:
            raise _fail(name, f"item {item!r} runs past the end of the file")
        if kind == TEXT and item.startswith("special:"):
            options.update(_options(bytes(data[pos:stop]).rstrip(b"\0").decode("utf-8", "replace")))
        elif not item.endswith(ACTIVATION_SCALE):
            out[item] = _decode(data[pos:stop], int(kind), shape, item, name)
        pos = stop
    return out, options


def _options(text: str) -> dict[str, str]:
    """Top-level scalar `key: value` lines of Marian's YAML (lists and nesting are not needed)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key and not key.startswith((" ", "-", "#")) and value.strip():
            out[key.strip()] = value.strip()
    return out


def _decode(raw: np.ndarray, kind: int, shape: tuple[int, ...], item: str, name: str) -> np.ndarray:
    n = math.prod(shape)
    if kind == FLOAT32:
        if raw.size < 4 * n:
            raise _fail(name, f"item {item!r} holds fewer values than its shape {shape}")
        return raw[:4 * n].view("<f4").reshape(shape).copy()
    if kind == INT8:
        if len(shape) != 2 or raw.size < n + 4:
            raise _fail(name, f"int8 item {item!r} has shape {shape} and {raw.size} bytes")
        scale = float(raw[n:n + 4].view("<f4")[0])
        if not math.isfinite(scale) or scale == 0:
            raise _fail(name, f"int8 item {item!r} has scale {scale}")
        q = raw[:n].view(np.int8)
        rows, cols = shape
        if item == "Wemb":  # the embeddings are stored as they are; every other matrix transposed
            w = q.reshape(rows, cols)
        else:
            w = q.reshape(cols, rows).T   # read (out, in), hand back Marian's (in, out)
        return np.ascontiguousarray(w, dtype=np.float32) / np.float32(scale)
    raise _fail(name, f"item {item!r} has type {kind:#x} (this reader knows float32 and int8)")


# ---------------------------------------------------------------- config half
def config_from(weights: dict[str, np.ndarray], options: dict[str, str], key: str = "bergamot") -> Seq2SeqConfig:
    """The shape of a Bergamot student, from its tensors and its embedded training options."""
    try:
        vocab, d = weights["Wemb"].shape
        d_ff = weights["encoder_l1_ffn_W1"].shape[1]
        has_rnn = "decoder_l1_rnn_W" in weights
    except KeyError as err:
        raise ValueError(f"{key}: the weights have no {err.args[0]!r}; not a Bergamot transformer") from None
    n_enc = _count(weights, "encoder_l{}_self_Wq")
    n_dec = _count(weights, "decoder_l{}_context_Wq")
    if not has_rnn or n_enc == 0 or n_dec == 0:
        raise ValueError(f"{key}: expected an SSRU decoder with cross-attention ('decoder_l1_rnn_W', "
                         "'decoder_l1_context_Wq') and an encoder; this file has another layout")
    heads = options.get("transformer-heads", str(HEADS))
    if not heads.isdigit() or int(heads) < 1 or d % int(heads):
        raise ValueError(f"{key}: width {d} is not a multiple of {heads} heads")
    for option, want in (("transformer-postprocess", "dan"), ("transformer-ffn-activation", "relu"),
                         ("transformer-decoder-autoreg", "rnn"), ("dec-cell", "ssru")):
        if options.get(option, want) != want:
            raise ValueError(f"{key}: {option} is {options[option]!r}; this converter reads {want!r} only")
    return Seq2SeqConfig(family=NAME, n_enc_layers=n_enc, n_dec_layers=n_dec, n_heads=int(heads),
                         d_model=int(d), d_ff=int(d_ff), vocab_size=int(vocab), decoder="ssru",
                         activation="relu", norm_eps=1e-6, positional="marian", embed_scale=math.sqrt(d),
                         zero_start=True, decoder_start_id=0, eos_id=0, pad_id=0,
                         max_positions=MAX_POSITIONS)


HEADS = 8              # Bergamot "tiny": 8 heads, when the file carries no transformer-heads option
MAX_POSITIONS = 1024   # sinusoidal: no table bounds it; our source-token limit stops far below


def _count(weights, pattern: str) -> int:
    n = 0
    while pattern.format(n + 1) in weights:
        n += 1
    return n


# ---------------------------------------------------------------- weights half
def state_from(weights: dict[str, np.ndarray], cfg: Seq2SeqConfig) -> dict[str, torch.Tensor]:
    """Marian names -> `attnviz.core.seq2seq.Seq2Seq` state. Linear weights become [out, in]."""
    used = set()

    def get(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in weights:
            raise ValueError(f"the Bergamot weights have no {name!r}")
        value = weights[name]
        if value.size != math.prod(shape):
            raise ValueError(f"{name}: shape {value.shape}, expected {shape}")
        used.add(name)
        return torch.from_numpy(np.ascontiguousarray(value)).reshape(shape)

    def linear(name: str, d_in: int, d_out: int) -> torch.Tensor:
        return get(name, (d_in, d_out)).T.contiguous()  # Marian multiplies from the right

    d, ff, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    state = {"tok.weight": get("Wemb", (V, d)), "lm_head.bias": get("decoder_ff_logit_out_b", (V,))}

    def attention(prefix: str, out: str, fused_qkv: bool):
        w = [linear(f"{prefix}_W{p}", d, d) for p in "qkv"]
        b = [get(f"{prefix}_b{p}", (d,)) for p in "qkv"]
        if fused_qkv:   # core Attention: one QKV projection
            state[f"{out}.qkv.weight"], state[f"{out}.qkv.bias"] = torch.cat(w), torch.cat(b)
        else:           # cross-attention: Q from the decoder, K and V (fused) from the encoder
            state[f"{out}.q.weight"], state[f"{out}.q.bias"] = w[0], b[0]
            state[f"{out}.kv.weight"], state[f"{out}.kv.bias"] = torch.cat(w[1:]), torch.cat(b[1:])
        state[f"{out}.out.weight"] = linear(f"{prefix}_Wo", d, d)
        state[f"{out}.out.bias"] = get(f"{prefix}_bo", (d,))

    def norm(name: str, out: str):
        state[f"{out}.weight"] = get(f"{name}_ln_scale", (d,))
        state[f"{out}.bias"] = get(f"{name}_ln_bias", (d,))

    def ffn(prefix: str, out: str):
        state[f"{out}.fc_in.weight"] = linear(f"{prefix}_W1", d, ff)
        state[f"{out}.fc_in.bias"] = get(f"{prefix}_b1", (ff,))
        state[f"{out}.fc_out.weight"] = linear(f"{prefix}_W2", ff, d)
        state[f"{out}.fc_out.bias"] = get(f"{prefix}_b2", (d,))

    for i in range(cfg.n_enc_layers):
        m, o = f"encoder_l{i + 1}", f"encoder.{i}"
        attention(f"{m}_self", f"{o}.attn", fused_qkv=True)
        norm(f"{m}_self_Wo", f"{o}.norm1")
        ffn(f"{m}_ffn", f"{o}.mlp")
        norm(f"{m}_ffn_ffn", f"{o}.norm2")
    for i in range(cfg.n_dec_layers):
        m, o = f"decoder_l{i + 1}", f"decoder.{i}"
        state[f"{o}.ssru.W.weight"] = linear(f"{m}_rnn_W", d, d)
        state[f"{o}.ssru.Wf.weight"] = linear(f"{m}_rnn_Wf", d, d)
        state[f"{o}.ssru.Wf.bias"] = get(f"{m}_rnn_bf", (d,))
        norm(f"{m}_rnn_ffn", f"{o}.norm_ssru")
        attention(f"{m}_context", f"{o}.cross", fused_qkv=False)
        norm(f"{m}_context_Wo", f"{o}.norm_cross")
        ffn(f"{m}_ffn", f"{o}.mlp")
        norm(f"{m}_ffn_ffn", f"{o}.norm_ffn")
    left = sorted(set(weights) - used)
    if left:
        raise ValueError(f"the Bergamot weights hold tensors this converter does not place: {left[:5]}")
    return state


def convert_bin(path: str | Path, key: str = "bergamot") -> tuple[Seq2SeqConfig, dict[str, torch.Tensor]]:
    weights, options = read_bin(path, name=key)
    cfg = config_from(weights, options, key)
    return cfg, state_from(weights, cfg)


# ---------------------------------------------------------------- a model folder
MAX_TOKENIZER_BYTES = 64 * 2**20


def model_file(folder: str | Path) -> Path:
    """The one `model*.bin` of a Bergamot folder (the lexical shortlist `lex*.bin` is not read:
    our decoder scores the whole vocabulary)."""
    found = sorted(p for p in Path(folder).glob("model*.bin") if p.is_file())
    if len(found) != 1:
        raise ValueError(f"a Bergamot model folder holds one model*.bin; found {len(found)}")
    return found[0]


SHORTLIST_MAGIC = 0xF11A48D5013417F5  # Marian's binary shortlist header


def read_shortlist(folder: str | Path) -> Shortlist | None:
    """The folder's `lex*.s2t.bin` (Marian's binary lexical shortlist), or None when it has none.
    Header: magic, checksum, firstNum, bestNum, offsets length, lists length (8 bytes each);
    then the offsets (uint64) and the target ids (uint32)."""
    found = sorted(Path(folder).glob("lex*.s2t.bin"))
    if not found:
        return None
    data = np.fromfile(found[0], dtype=np.uint8)
    if data.size < 48:
        raise ValueError(f"{found[0].name}: shorter than a shortlist header")
    magic, _, first, _, n_offsets, n_pieces = (int(v) for v in data[:48].view("<u8"))
    if magic != SHORTLIST_MAGIC or 48 + 8 * n_offsets + 4 * n_pieces != data.size:
        raise ValueError(f"{found[0].name}: not a Marian binary shortlist")
    offsets = data[48:48 + 8 * n_offsets].view("<u8").astype(np.int64)
    pieces = data[48 + 8 * n_offsets:].view("<u4").astype(np.int64)
    return Shortlist(first, torch.from_numpy(offsets), torch.from_numpy(pieces))


def for_cache(folder: str | Path, key: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """What the safetensors cache stores: ({"config": ...}, our state)."""
    cfg, state = convert_bin(model_file(folder), key)
    return {"config": asdict(cfg)}, state


def build(meta: dict, state: dict[str, torch.Tensor], folder: str | Path, key: str, *, source: str,
          **info) -> Seq2SeqModel:
    """A `Seq2SeqModel` from converted (possibly cached) tensors and the folder's tokenizer.json."""
    from tokenizers import Tokenizer
    path = Path(folder) / "tokenizer.json"
    if not path.is_file() or path.stat().st_size > MAX_TOKENIZER_BYTES:
        raise ValueError(f"{key}: tokenizer.json is missing or over {MAX_TOKENIZER_BYTES >> 20} MiB")
    return Seq2SeqModel.build(Seq2SeqConfig(**meta["config"]), state, key, source,
                              Tokenizer.from_file(str(path)), read_shortlist(folder), **info)
