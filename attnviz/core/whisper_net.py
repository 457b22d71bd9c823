"""Whisper (Radford et al. 2022) as an encoder-decoder of `attnviz.core.seq2seq`.

Only what differs from the translation models lives here: the audio front-end (two 1-D
convolutions with GELU, the second halving time: 3,000 log-mel frames of 10 ms -> 1,500 encoder
frames of 20 ms), sinusoid positions on the audio frames (a table: checkpoints store them rounded), a learned position table of 448 rows on
the text side, and the token prompt. Everything else is `Seq2Seq` with `pre_norm=True`: core
pre-norm `Block`s for the encoder, `CrossBlock`s with causal self-attention (K/V cached in the
per-call `DecoderState`) and cross-attention over the audio frames for the decoder, both run by the
one block runner (`attnviz.core.blocks.iter_layers`: head masks, mean ablation, variants and the
per-block check included), a final LayerNorm on each side, the output projection tied to the token
embeddings.

Cross-attention row t, [n_frames], says which 20 ms audio frames the decoder read while choosing
text token t.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnviz.core.seq2seq import Seq2Seq, Seq2SeqConfig, sinusoid_halves

SAMPLE_RATE = 16_000
HOP = 160                     # samples per log-mel frame (10 ms)
WINDOW_SECONDS = 30           # Whisper always hears a 30 s window, padded with silence
FRAMES_PER_SECOND = 50        # encoder frames: the second convolution halves 100 mel frames per second


@dataclass(frozen=True)
class WhisperConfig(Seq2SeqConfig):
    n_mels: int = 80
    n_audio_ctx: int = 1500       # encoder frames of one 30 s window
    n_text_ctx: int = 448         # decoder positions (the prompt included)
    sot_id: int = 50257           # <|startoftranscript|>
    no_timestamps_id: int = 50362  # <|notimestamps|>
    language_id: int = -1         # multilingual models: <|en|> etc. after sot (-1: English-only model)
    transcribe_id: int = -1       # multilingual models: <|transcribe|>
    alignment_heads: tuple = ()   # ((layer, head), ...) of the decoder's cross-attention: word timing
    suppress_ids: tuple = ()      # never chosen (non-speech symbols, special tokens)
    suppress_begin_ids: tuple = ()  # not chosen first (a blank, the end of text)

    def __post_init__(self):
        super().__post_init__()
        if not self.pre_norm:
            raise ValueError("a WhisperConfig is pre-norm (pre_norm=True)")
        bad = [lh for lh in self.alignment_heads
               if not (0 <= lh[0] < self.n_dec_layers and 0 <= lh[1] < self.n_heads)]
        if bad:
            raise ValueError(f"alignment heads {bad} lie outside {self.n_dec_layers} layers x {self.n_heads} heads")

    @property
    def task(self) -> str:
        return "speech"

    @classmethod
    def from_dict(cls, d: dict) -> "WhisperConfig":
        """From `dataclasses.asdict` after a JSON round trip (lists back to tuples)."""
        d = dict(d, alignment_heads=tuple(tuple(lh) for lh in d.get("alignment_heads", ())))
        for k in ("suppress_ids", "suppress_begin_ids"):
            d[k] = tuple(d.get(k, ()))
        return cls(**d)

    @property
    def n_samples(self) -> int:
        """Samples of one window: 30 s at 16 kHz."""
        return 2 * self.n_audio_ctx * HOP

    def prompt(self) -> list[int]:
        """The decoder's first tokens: start of transcript, (language, task,) no timestamps."""
        extra = [i for i in (self.language_id, self.transcribe_id) if i >= 0]
        return [self.sot_id, *extra, self.no_timestamps_id]


def whisper_config(**kw) -> WhisperConfig:
    """A WhisperConfig with Whisper's fixed choices filled in (GELU, LayerNorm eps 1e-5, biases,
    pre-norm, the sinusoid table sized to the audio frames)."""
    kw.setdefault("n_audio_ctx", 1500)
    return WhisperConfig(family="whisper", decoder="attention", activation="gelu", norm_eps=1e-5,
                         positional="learned", max_positions=kw["n_audio_ctx"], pre_norm=True, **kw)


class Whisper(Seq2Seq):
    """`Seq2Seq` with an audio front-end: `encode(features (B, n_mels, 2 * n_audio_ctx))`."""

    def __init__(self, cfg: WhisperConfig):
        super().__init__(cfg)
        d = cfg.d_model
        self.conv1 = nn.Conv1d(cfg.n_mels, d, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d, d, kernel_size=3, stride=2, padding=1)
        self.dec_pos = nn.Embedding(cfg.n_text_ctx, d)
        # Audio positions are fixed sinusoids, but a table of weights: checkpoints store them rounded
        # to half precision, and the engines add the stored values.
        if not self.enc_pos.weight.is_meta:
            with torch.no_grad():
                self.enc_pos.weight.copy_(sinusoid_halves(cfg.n_audio_ctx, d))

    def embed(self, x, start: int, side: str):
        """enc: features (B, n_mels, 2N) -> (B, N, d); dec: ids (B, T) at start.. -> (B, T, d)."""
        cfg = self.cfg
        if side == "enc":
            if x.shape[1:] != (cfg.n_mels, 2 * cfg.n_audio_ctx):
                raise ValueError(f"Whisper hears [{cfg.n_mels}, {2 * cfg.n_audio_ctx}] log-mel frames "
                                 f"(30 s); got {list(x.shape[1:])}")
            x = F.gelu(self.conv1(x))
            x = F.gelu(self.conv2(x)).transpose(1, 2)          # (B, d, N) -> (B, N, d)
            return x + self.enc_pos.weight[:x.shape[1]]
        T = x.shape[1]
        if start + T > cfg.n_text_ctx:
            raise ValueError(f"Whisper's decoder has {cfg.n_text_ctx} positions; position {start + T - 1} asked")
        return self.tok(x) + self.dec_pos.weight[start:start + T]
