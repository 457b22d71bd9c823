"""Whisper: a config half and a weights half for two sources, onto `attnviz.core.whisper_net.Whisper`.

- transformers (`WhisperForConditionalGeneration` / `WhisperModel`, or a `whisper` folder): separate
  q/k/v projections, the key without a bias (ours gets a zero one), the output tied to the tokens;
- CTranslate2's `WhisperSpec` (a folder's `model.bin`, read by `ctranslate2.py` beside this file):
  self-attention Q/K/V fused in `linear_0`, cross-attention K/V fused in `attention/linear_1`, the
  stored key bias zero, `decoder/projection` an alias of the embeddings; `config.json` carries the
  alignment heads and the suppressed tokens. `load_folder` converts such a folder once into the cache.
Both write the same names: a checkpoint converted from either runs through the same modules.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from attnviz.core.seq2seq import sinusoid_halves
from attnviz.core.speech_model import SpeechModel
from attnviz.core.whisper_net import WhisperConfig, whisper_config
from attnviz.weights.conversion_cache import converted
from attnviz.weights.families.ctranslate2 import read_model_bin
from attnviz.weights.mapper import Mapper, get

NAME = "whisper"
TASK = "speech"          # an encoder-decoder: built as `Whisper`, not the core `Transformer`
PREFIXES = ("model.",)
SPECIALS = ("<|startoftranscript|>", "<|notimestamps|>", "<|endoftext|>")
MULTILINGUAL_VOCAB = 51865  # Whisper's rule: English-only models have 51,864 tokens
POSITION_TOLERANCE = 1e-3  # the stored encoder positions: Whisper's sinusoids, up to half-precision rounding


# ---------------------------------------------------------------- config halves
def config(hf, sd: dict | None = None, *, alignment_heads=(), suppress_ids=(), suppress_begin_ids=(),
           no_timestamps_id=None) -> WhisperConfig:
    """A transformers WhisperConfig (object or dict) -> ours. The generation settings (alignment
    heads, suppressed tokens) live in transformers' generation config: pass them."""
    if get(hf, "encoder_attention_heads") != get(hf, "decoder_attention_heads") or \
            get(hf, "encoder_ffn_dim") != get(hf, "decoder_ffn_dim"):
        raise ValueError("Whisper checkpoints with different encoder and decoder widths are not supported")
    if get(hf, "activation_function", "gelu") != "gelu":
        raise ValueError("this converter reads Whisper with GELU only")
    vocab = get(hf, "vocab_size")
    sot = get(hf, "decoder_start_token_id", 50257)
    multilingual = vocab >= MULTILINGUAL_VOCAB
    nots = no_timestamps_id if no_timestamps_id is not None else (50363 if multilingual else 50362)
    return whisper_config(
        n_enc_layers=get(hf, "encoder_layers"), n_dec_layers=get(hf, "decoder_layers"),
        n_heads=get(hf, "encoder_attention_heads"), d_model=get(hf, "d_model"), d_ff=get(hf, "encoder_ffn_dim"),
        vocab_size=vocab, n_mels=get(hf, "num_mel_bins", 80), n_audio_ctx=get(hf, "max_source_positions", 1500),
        n_text_ctx=get(hf, "max_target_positions", 448), eos_id=get(hf, "eos_token_id", 50256),
        pad_id=get(hf, "pad_token_id", 50256) or 0, decoder_start_id=sot, sot_id=sot,
        no_timestamps_id=min(nots, vocab - 1), language_id=sot + 1 if multilingual else -1,
        transcribe_id=(sot + 101 if vocab == 51865 else sot + 102) if multilingual else -1,
        alignment_heads=tuple(tuple(int(v) for v in lh) for lh in alignment_heads),
        suppress_ids=tuple(int(i) for i in suppress_ids if 0 <= int(i) < vocab),
        suppress_begin_ids=tuple(int(i) for i in suppress_begin_ids if 0 <= int(i) < vocab))


def ct2_config(variables: dict[str, np.ndarray], settings: dict, tokenizer) -> WhisperConfig:
    """CTranslate2's WhisperSpec variables, its config.json and tokenizer -> ours."""
    def count(side):
        n = 0
        while f"{side}/layer_{n}/ffn/linear_0/weight" in variables:
            n += 1
        return n
    try:
        vocab, d = variables["decoder/embeddings/weight"].shape
        d_ff = variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]
        n_mels = variables["encoder/conv1/weight"].shape[1]
        n_audio = variables["encoder/position_encodings/encodings"].shape[0]
        n_text = variables["decoder/position_encodings/encodings"].shape[0]
        heads = int(variables["encoder/num_heads"]) if "encoder/num_heads" in variables else d // 64
    except KeyError as err:
        raise ValueError(f"the CTranslate2 model has no {err.args[0]!r}; not a Whisper model") from None
    ids = {}
    for name in SPECIALS:
        i = tokenizer.token_to_id(name)
        if i is None:
            raise ValueError(f"the Whisper tokenizer has no {name}")
        ids[name] = i
    multilingual = int(vocab) >= MULTILINGUAL_VOCAB  # English-only tokenizers hold the language tokens too
    heads_ = settings.get("alignment_heads") or []
    return whisper_config(
        n_enc_layers=count("encoder"), n_dec_layers=count("decoder"), n_heads=heads, d_model=int(d),
        d_ff=int(d_ff), vocab_size=int(vocab), n_mels=int(n_mels), n_audio_ctx=int(n_audio),
        n_text_ctx=int(n_text), eos_id=ids["<|endoftext|>"], pad_id=ids["<|endoftext|>"],
        decoder_start_id=ids["<|startoftranscript|>"], sot_id=ids["<|startoftranscript|>"],
        no_timestamps_id=ids["<|notimestamps|>"],
        language_id=tokenizer.token_to_id("<|en|>") if multilingual else -1,
        transcribe_id=tokenizer.token_to_id("<|transcribe|>") if multilingual else -1,
        alignment_heads=tuple((int(l), int(h)) for l, h in heads_),
        suppress_ids=tuple(int(i) for i in settings.get("suppress_ids", ())),
        suppress_begin_ids=tuple(int(i) for i in settings.get("suppress_ids_begin", ())))


def size(hf, b) -> int:
    """Parameters the config implies, every size read through the folder's bounds `b`."""
    d, h = b.width("d_model"), b.heads("encoder_attention_heads")
    ff = b.ff("encoder_ffn_dim")
    L_enc, L_dec = b.layers("encoder_layers"), b.layers("decoder_layers")
    blocks = b.blocks(L_enc, d, h, h, None, ff, gated=False) + b.blocks(L_dec, d, h, h, None, ff, gated=False)
    cross = L_dec * 4 * (d * d + d)
    return blocks + cross + (b.vocab("vocab_size") + b.positions("max_target_positions")) * d + 4 * d * d * 3


# ---------------------------------------------------------------- weights halves
def check_positions(table: torch.Tensor, what: str):
    """Whisper's audio positions are fixed sinusoids; a checkpoint whose table differs is refused."""
    want = sinusoid_halves(table.shape[0], table.shape[1])
    if (table.float() - want).abs().max() > POSITION_TOLERANCE:
        raise ValueError(f"{what}: the encoder positions are not Whisper's sinusoids; not supported")


def weights(cfg: WhisperConfig, sd: dict) -> dict[str, torch.Tensor]:
    """transformers names -> ours."""
    m = Mapper(sd, PREFIXES)
    d = cfg.d_model
    zero = torch.zeros(d)
    for side in ("encoder", "decoder"):
        for i in range(cfg.n_enc_layers if side == "encoder" else cfg.n_dec_layers):
            p, o = f"{side}.layers.{i}.", f"{side}.{i}."
            q, k, v = (f"{p}self_attn.{x}_proj" for x in "qkv")
            if side == "encoder":
                m.norm(o + "norm1", p + "self_attn_layer_norm")
                m.put(o + "attn.qkv.weight", torch.cat([m.take(f"{x}.weight") for x in (q, k, v)]))
                m.put(o + "attn.qkv.bias", torch.cat([m.take(q + ".bias"), zero, m.take(v + ".bias")]))
                m.linear(o + "attn.out", p + "self_attn.out_proj")
                m.norm(o + "norm2", p + "final_layer_norm")
            else:
                m.norm(o + "norm_self", p + "self_attn_layer_norm")
                m.linear(o + "self_attn.q", q)
                m.put(o + "self_attn.kv.weight", torch.cat([m.take(k + ".weight"), m.take(v + ".weight")]))
                m.put(o + "self_attn.kv.bias", torch.cat([zero, m.take(v + ".bias")]))
                m.linear(o + "self_attn.out", p + "self_attn.out_proj")
                c = p + "encoder_attn."
                m.norm(o + "norm_cross", p + "encoder_attn_layer_norm")
                m.linear(o + "cross.q", c + "q_proj")
                m.put(o + "cross.kv.weight", torch.cat([m.take(c + "k_proj.weight"), m.take(c + "v_proj.weight")]))
                m.put(o + "cross.kv.bias", torch.cat([zero, m.take(c + "v_proj.bias")]))
                m.linear(o + "cross.out", c + "out_proj")
                m.norm(o + "norm_ffn", p + "final_layer_norm")
            o = o + "mlp."
            m.linear(o + "fc_in", p + "fc1")
            m.linear(o + "fc_out", p + "fc2")
    for i in (1, 2):
        m.linear(f"conv{i}", f"encoder.conv{i}")
    m.put("enc_pos.weight", m.take("encoder.embed_positions.weight"))
    check_positions(m.out["enc_pos.weight"], "transformers Whisper")
    m.norm("enc_final_norm", "encoder.layer_norm")
    m.norm("dec_final_norm", "decoder.layer_norm")
    m.put("tok.weight", m.take("decoder.embed_tokens.weight"))
    m.put("dec_pos.weight", m.take("decoder.embed_positions.weight"))
    m.put("lm_head.bias", torch.zeros(cfg.vocab_size))  # Whisper's output has no bias
    return m.out


def ct2_weights(cfg: WhisperConfig, variables: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """CTranslate2 WhisperSpec names -> ours (same layout as `weights`)."""
    sd = {}
    used = set()

    def take(name: str) -> torch.Tensor:
        if name not in variables:
            raise ValueError(f"the CTranslate2 Whisper model has no {name!r}")
        used.add(name)
        return torch.from_numpy(np.ascontiguousarray(variables[name], dtype=np.float32))

    def linear(ours: str, theirs: str):
        sd[ours + ".weight"], sd[ours + ".bias"] = take(theirs + "/weight"), take(theirs + "/bias")

    def norm(ours: str, theirs: str):
        sd[ours + ".weight"], sd[ours + ".bias"] = take(theirs + "/gamma"), take(theirs + "/beta")

    d = cfg.d_model
    for i in range(cfg.n_enc_layers):
        p, o = f"encoder/layer_{i}/", f"encoder.{i}."
        norm(o + "norm1", p + "self_attention/layer_norm")
        linear(o + "attn.qkv", p + "self_attention/linear_0")      # (3d, d): Q, K, V
        linear(o + "attn.out", p + "self_attention/linear_1")
        norm(o + "norm2", p + "ffn/layer_norm")
        linear(o + "mlp.fc_in", p + "ffn/linear_0")
        linear(o + "mlp.fc_out", p + "ffn/linear_1")
    for i in range(cfg.n_dec_layers):
        p, o = f"decoder/layer_{i}/", f"decoder.{i}."
        norm(o + "norm_self", p + "self_attention/layer_norm")
        w, b = take(p + "self_attention/linear_0/weight"), take(p + "self_attention/linear_0/bias")
        sd[o + "self_attn.q.weight"], sd[o + "self_attn.kv.weight"] = w[:d], w[d:]   # (3d, d) -> Q | K, V
        sd[o + "self_attn.q.bias"], sd[o + "self_attn.kv.bias"] = b[:d], b[d:]
        linear(o + "self_attn.out", p + "self_attention/linear_1")
        norm(o + "norm_cross", p + "attention/layer_norm")
        linear(o + "cross.q", p + "attention/linear_0")
        linear(o + "cross.kv", p + "attention/linear_1")          # (2d, d): K, V from the audio
        linear(o + "cross.out", p + "attention/linear_2")
        norm(o + "norm_ffn", p + "ffn/layer_norm")
        linear(o + "mlp.fc_in", p + "ffn/linear_0")
        linear(o + "mlp.fc_out", p + "ffn/linear_1")
    for i in (1, 2):
        linear(f"conv{i}", f"encoder/conv{i}")
    sd["enc_pos.weight"] = take("encoder/position_encodings/encodings")
    check_positions(sd["enc_pos.weight"], "CTranslate2 Whisper")
    norm("enc_final_norm", "encoder/layer_norm")
    norm("dec_final_norm", "decoder/layer_norm")
    sd["tok.weight"] = take("decoder/embeddings/weight")
    sd["dec_pos.weight"] = take("decoder/position_encodings/encodings")
    sd["lm_head.bias"] = torch.zeros(cfg.vocab_size)
    if "decoder/projection/weight" in variables:  # an alias of the embeddings: tied
        if not np.array_equal(variables["decoder/projection/weight"], variables["decoder/embeddings/weight"]):
            raise ValueError("the CTranslate2 Whisper output projection is not tied to the embeddings")
        used.add("decoder/projection/weight")
    flags = {k for k in variables if variables[k].ndim == 0}  # num_heads, activation, pre_norm, ...
    left = sorted(set(variables) - used - flags)
    if left:
        raise ValueError(f"the CTranslate2 Whisper model holds tensors this converter does not place: {left[:5]}")
    return sd


def from_hf(hf_model, tokenizer=None, key: str | None = None) -> SpeechModel:
    """An in-memory `WhisperForConditionalGeneration` -> a `SpeechModel` (the HF model unchanged);
    the alignment heads and suppressed tokens come from its generation config."""
    gen = getattr(hf_model, "generation_config", None)
    heads = get(gen, "alignment_heads", None) or [] if gen is not None else []
    sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    cfg = config(hf_model.config, sd, alignment_heads=heads,
                 suppress_ids=get(gen, "suppress_tokens", None) or [] if gen is not None else [],
                 suppress_begin_ids=get(gen, "begin_suppress_tokens", None) or [] if gen is not None else [],
                 no_timestamps_id=get(gen, "no_timestamps_token_id", None) if gen is not None else None)
    return SpeechModel.build(cfg, weights(cfg, sd), key or "hf:whisper", "in-memory transformers model", tokenizer)


# ---------------------------------------------------------------- a CTranslate2 Whisper folder
MAX_SIDE_FILE_BYTES = 64 * 2**20   # config.json, tokenizer.json
CONVERTER_VERSION = 2              # raise when the converted config or state changes


def _side_file(folder: Path, name: str) -> Path:
    path = folder / name
    if not path.is_file() or path.stat().st_size > MAX_SIDE_FILE_BYTES:
        raise ValueError(f"a CTranslate2 Whisper folder holds {name} (under {MAX_SIDE_FILE_BYTES >> 20} MiB)")
    return path


def whisper_parts(folder: str | Path, key: str = "whisper"):
    """(config, state, tokenizer) of a CTranslate2 Whisper folder: model.bin, config.json, tokenizer.json."""
    folder = Path(folder)
    variables, header = read_model_bin(folder / "model.bin", key)
    if header["spec"] != "WhisperSpec":
        raise ValueError(f"{key}: the model.bin holds a {header['spec'] or 'unnamed'} spec, not WhisperSpec")
    settings = json.loads(_side_file(folder, "config.json").read_text())
    tokenizer = Tokenizer.from_file(str(_side_file(folder, "tokenizer.json")))
    cfg = ct2_config(variables, settings, tokenizer)
    return cfg, ct2_weights(cfg, variables), tokenizer


def for_cache(folder: str | Path, key: str) -> tuple[dict, dict]:
    """What the safetensors cache stores: ({"config": ...}, our state)."""
    cfg, state, _ = whisper_parts(folder, key)
    return {"config": asdict(cfg)}, state


def build(meta: dict, state: dict, folder: str | Path, key: str, **info) -> SpeechModel:
    """A `SpeechModel` from converted (possibly cached) tensors and the folder's tokenizer.json."""
    tokenizer = Tokenizer.from_file(str(_side_file(Path(folder), "tokenizer.json")))
    return SpeechModel.build(WhisperConfig.from_dict(meta["config"]), state, key, tokenizer=tokenizer, **info)


def load_folder(folder: str | Path, key: str, **info) -> SpeechModel:
    """A CTranslate2 Whisper folder, converted once into the safetensors cache."""
    folder = Path(folder)
    # the cache entry is named after the converter's version too: a fixed converter never reads an old entry
    meta, state, _ = converted(f"{key}.v{CONVERTER_VERSION}", folder / "model.bin", lambda tmp: for_cache(folder, key))
    return build(meta, state, folder, key, **info)
