"""The public object of speech models: `SpeechModel.transcribe(audio)` -> `Transcript`.

A `Seq2SeqModel` (the translation models' object: its greedy loop; the checks, info and
fingerprint every `BaseModel` has) over `attnviz.core.whisper_net.Whisper`: the audio's log-mel frames
are encoded once, then the decoder runs greedy and incremental from Whisper's prompt, the configured
tokens suppressed as Whisper does. `trace(audio)` is `transcribe(audio)`. What comes back:

    cross_attentions    [L_dec, H, n_tokens, n_frames]  row t: the 20 ms frames read choosing token t
    encoder_attentions  [L_enc, H, n_frames, n_frames]  when asked (216 MB for tiny: off by default)
    words               start / end seconds from the alignment heads (`word_timing`)

n_frames is the whole 30 s window (1,500); `audio_frames` says how many of them hold the audio
(the rest is padding). Tokens end with the end of text.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from attnviz.base.jobs import Deadline
from attnviz.base.limits import LIMITS
from attnviz.core.attention import parse_variant
from attnviz.core import decoding
from attnviz.core.base_model import ModelInfo
from attnviz.uploads.audio import RATE, Audio, log_mel, read_audio
from attnviz.core.translator import Seq2SeqModel
from attnviz.core.whisper_net import FRAMES_PER_SECOND, HOP, Whisper, WhisperConfig

MEDIAN_WIDTH = 7               # Whisper's median filter over time, in encoder frames (140 ms)
PREPENDED = "\"'“¿([{-"       # punctuation joined to the word after it (Whisper's lists)
APPENDED = "\"'.。,，!！?？:：”)]}、"  # ... to the word before it
SENTENCE_END = ".。!！?？"
MAX_MEDIAN_WORD = 0.7          # seconds: words longer than 2 x min(median, this) next to a sentence end are cut
# The last word's end from the alignment heads is the frame where the path moves to the end-of-text
# row: the decoder is ready to end the text while the word's last sounds still ring, so that end
# came 0.1-0.3 s early in every clip. It is moved to where the sound itself falls silent: the last
# 20 ms frame whose peak is within SILENCE_DB of the clip's loudest, at most LAST_WORD_EXTRA later.
SILENCE_DB = -30.0
LAST_WORD_EXTRA = 0.6          # seconds


@dataclass
class Word:
    text: str               # as decoded, with its leading space
    start: float            # seconds from the start of the audio
    end: float
    probability: float      # mean probability of its tokens when chosen
    tokens: list[int]       # positions in `Transcript.tokens`


@dataclass
class Transcript:
    text: str
    tokens: list[str]                           # [n_tokens] as the tokenizer writes them, the end of text included
    ids: torch.Tensor                           # [n_tokens]
    logprobs: torch.Tensor                      # [n_tokens] log-probability of each token when chosen
    cross_attentions: torch.Tensor              # [L_dec, H, n_tokens, n_frames]
    encoder_attentions: torch.Tensor | None     # [L_enc, H, n_frames, n_frames] (encoder_attentions=True)
    words: list[Word]
    features: torch.Tensor                      # [n_mels, 2 * n_frames] the log-mel spectrogram
    audio: Audio
    audio_frames: int                           # encoder frames holding audio (the rest: padding)
    alignment_heads: list[tuple[int, int]] = field(default_factory=list)
    stopped: str = "eos"                        # eos | max_tokens | deadline

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def seconds(self) -> float:
        """The audio heard (after any cut)."""
        return self.audio.duration

    @property
    def truncated_seconds(self) -> float:
        return self.audio.truncated_seconds


class SpeechModel(Seq2SeqModel):
    """Whisper plus its tokenizer. Shared, never mutated by a call."""

    def __init__(self, net: Whisper, info: ModelInfo, tokenizer=None):
        super().__init__(net, info, tokenizer)
        self.tokenizer = tokenizer
        cfg: WhisperConfig = net.cfg
        self._always = torch.tensor(cfg.suppress_ids, dtype=torch.long)
        self._begin = torch.tensor(cfg.suppress_ids + cfg.suppress_begin_ids, dtype=torch.long)

    @classmethod
    def build(cls, cfg: WhisperConfig, state: dict, key: str, source: str, tokenizer=None,
              **info) -> "SpeechModel":
        """Adopt converted tensors (a family's weights half, or the cache) as a shared model."""
        net = Whisper.from_state(cfg, state)
        return cls(net, cls.describe(key, cfg, source, net, **info), tokenizer)

    @classmethod
    def shape(cls, cfg: WhisperConfig) -> dict:
        return dict(super().shape(cfg), max_positions=cfg.n_text_ctx)   # the decoder's positions

    def __repr__(self):
        c = self.cfg
        return (f"SpeechModel({self.info.key!r}, whisper, {c.n_enc_layers}+{c.n_dec_layers} layers "
                f"x {c.n_heads} heads)")

    @property
    def kind(self) -> str:
        return "speech"

    @property
    def alignment_heads(self) -> list[tuple[int, int]]:
        return [tuple(lh) for lh in self.cfg.alignment_heads]

    # ---------------------------------------------------------------- Seq2SeqModel's hooks
    def _start_ids(self, n: int = 1) -> torch.Tensor:
        return torch.tensor([self.cfg.prompt()] * n, dtype=torch.long)

    def adjust_logits(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        """Whisper's suppression: `suppress_ids` always; a blank or the end of text not first."""
        return logits.index_fill_(0, self._begin if step == 0 else self._always, float("-inf"))

    # ---------------------------------------------------------------- running
    def features(self, audio: Audio) -> torch.Tensor:
        """[n_mels, 3000]: one 30 s window of log-mel frames."""
        return log_mel(audio.samples, self.cfg.n_mels, self.cfg.n_samples)

    def transcribe(self, audio, head_mask=None, *, encoder_head_mask=None, self_head_mask=None,
                   encoder_attentions: bool = False, cut: bool = False, rate: int = 16_000,
                   max_tokens: int | None = None, head_fill=None, encoder_head_fill=None, variant=None,
                   check=None, memory=None) -> Transcript:
        """Transcribe WAV/FLAC bytes or float samples at `rate` (16 kHz unless told), up to 30 s
        (longer: ValueError, or the first 30 s with `cut=True`). `head_mask` [L_dec, H] switches
        cross-attention heads off (1 keeps, 0 removes); `encoder_head_mask` [L_enc, H] and
        `self_head_mask` [L_dec, H] the others; `head_fill` / `encoder_head_fill` [L, H, d_head]
        are added to those heads' outputs after the mask (mean ablation, see `head_means`).
        `variant`: the encoder's attention variant (a `Variant` or its name, e.g. 'local:64');
        `check()` (a cancel) runs with the time limit's check before every encoder block.
        `memory`: this audio's encoder output as `encode_audio(features)` gave it (no encoder mask,
        fill or variant), reused when only decoder heads change: the encoder is not run again."""
        c = self.cfg
        masks = dict(self._masks(head_mask, encoder_head_mask, self_head_mask), vocab=None)  # whole vocabulary
        masks.update(self._fills(head_fill, encoder_head_fill), variant=parse_variant(variant))
        heard = audio if isinstance(audio, Audio) else read_audio(
            audio, rate=rate, cut=cut, max_seconds=c.n_samples / RATE)
        n_max = self.target_limit(0, max_tokens)
        feats = self.features(heard)
        deadline = Deadline(LIMITS.max_transcribe_seconds, "the transcription")

        def every_block():
            deadline.check()
            if check is not None:
                check()
        with torch.inference_mode():
            if memory is None:
                memory, enc_att = self.encode_audio(feats, masks, encoder_attentions, check=every_block)
            elif (encoder_head_mask is not None or encoder_head_fill is not None or variant is not None
                  or encoder_attentions):
                raise ValueError("a reused encoder output holds no encoder mask, fill, variant or attentions")
            else:
                enc_att = None
            start = self.net.start(memory)  # every decoder layer's K/V of the audio frames, once for both passes
            out = self._greedy(memory, masks, n_max, deadline, True, True, start)
            audio_frames = min(c.n_audio_ctx, len(heard.samples) // HOP // 2)  # mel frames / 2
            words = last_word_to_silence(self._words(memory, masks, out.ids.tolist(), audio_frames, start),
                                         heard.samples)
        ids = out.ids.tolist()
        text = self.pieces.decode(ids).strip() if self.pieces else " ".join(map(str, ids))
        return Transcript(text=text, tokens=self.pieces.labels(ids) if self.pieces else [str(i) for i in ids],
                          ids=out.ids, logprobs=out.logprobs, cross_attentions=out.cross, encoder_attentions=enc_att,
                          words=words, features=feats, audio=heard, audio_frames=audio_frames,
                          alignment_heads=self.alignment_heads, stopped=out.stopped)

    def trace(self, audio, head_mask=None, **options) -> Transcript:
        """The common entry: a speech model's run on `audio` is its transcription (`transcribe`'s
        options)."""
        return self.transcribe(audio, head_mask, **options)

    def translate(self, text, *args, **options):
        raise ValueError(f"model {self.info.key!r} transcribes speech; give it audio through transcribe()")

    def target_bound(self, n_src: int) -> int:
        """Whisper's decoder positions bound the tokens (the prompt takes some)."""
        return self.cfg.n_text_ctx - len(self.cfg.prompt())

    def encode_audio(self, feats: torch.Tensor, masks: dict | None = None, attentions: bool = False,
                     check=None, variant=None):
        """feats [n_mels, 3000] -> (memory (1, n_frames, d), [L_enc, H, n_frames, n_frames] or None),
        through the block runner (`check()` before every block; `variant` unless `masks` has one)."""
        masks = dict(masks or self._masks(None, None, None))
        masks.setdefault("variant", parse_variant(variant))
        return self._encode(feats, masks, attentions, check)

    def _words(self, memory, masks, ids: list[int], audio_frames: int, start=None) -> list[Word]:
        """Word timing as Whisper's: the prompt, the text and the end of text teacher-forced once,
        the alignment heads' cross-attention over the audio frames, median filter, DTW. `start`: a
        `net.start(memory)` whose encoder K/V to reuse."""
        c = self.cfg
        # a decoding stopped at the last position leaves no room for the end of text: its last token untimed
        text = [i for i in ids if i < c.eos_id][:c.n_text_ctx - len(c.prompt()) - 1]
        if not text or not c.alignment_heads or audio_frames < 2 or self.tokenizer is None:
            return []
        prompt = c.prompt()
        feed = torch.tensor([prompt + text + [c.eos_id]])
        heads = self.alignment_heads
        layers = {l for l, _ in heads}
        out = self.net.step(feed, decoding.opened(self.net, memory, start), head_mask=masks["cross"],
                            head_fill=masks.get("cross_fill"),
                            self_head_mask=masks["self"], need_weights={i: i in layers for i in range(c.n_dec_layers)})
        weights = torch.stack([out.cross[l][0, h] for l, h in heads])          # [n_heads, n_feed, n_frames]
        probs = torch.softmax(out.logits[0, len(prompt) - 1:-1, :c.eos_id].float(), dim=-1)
        text_probs = probs[torch.arange(len(text)), torch.tensor(text)]
        return word_times(weights.numpy(), len(prompt) - 1, audio_frames, text_probs.numpy(),
                          decode=lambda group: self.tokenizer.decode([text[i] for i in group]))


# ---------------------------------------------------------------- word timing (Whisper's recipe)
def alignment_matrix(weights: np.ndarray, skip: int, audio_frames: int) -> np.ndarray:
    """weights [n_heads, n_feed, n_frames]: the alignment heads' cross-attention over the fed prompt,
    text and end of text -> [n_text + 1, audio_frames]: each head's weights renormalised over the
    frames holding audio (= its softmax over those frames), standardised per frame across the
    tokens, median-filtered over time, averaged over heads; rows from the last prompt token."""
    w = weights[:, :, :audio_frames].astype(np.float64)
    w = w / w.sum(-1, keepdims=True)
    mean, std = w.mean(-2, keepdims=True), w.std(-2, keepdims=True)   # over tokens, per frame
    w = (w - mean) / np.where(std > 0, std, 1.0)
    if audio_frames > MEDIAN_WIDTH // 2:  # 'mirror' is torch's 'reflect' padding, as Whisper pads
        from scipy.ndimage import median_filter   # here, not at start-up: see uploads.audio
        w = median_filter(w, size=(1, 1, MEDIAN_WIDTH), mode="mirror")
    return w.mean(0)[skip:-1]


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through `cost` [N, M] from (0, 0) to (N-1, M-1), steps
    diagonal, down (next token) or right (next frame) -> (row indices, column indices).
    Anti-diagonals are computed at once: cell (i, j) needs only the two diagonals before it.
    Ties go right, then down, as Whisper's."""
    N, M = cost.shape
    acc = np.full((N + 1, M + 1), np.inf)
    step = np.full((N + 1, M + 1), 2, dtype=np.int8)     # 0 diagonal, 1 down, 2 right
    acc[0, 0] = 0.0
    for k in range(2, N + M + 1):                        # i + j = k, 1 <= i <= N, 1 <= j <= M
        i = np.arange(max(1, k - M), min(N, k - 1) + 1)
        j = k - i
        c0, c1, c2 = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
        t = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        acc[i, j] = cost[i - 1, j - 1] + np.choose(t, [c0, c1, c2])
        step[i, j] = t
    step[0, :], step[:, 0] = 2, 1
    i, j, path = N, M, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = step[i, j]
        i, j = (i - 1, j - 1) if t == 0 else (i - 1, j) if t == 1 else (i, j - 1)
    rows, cols = np.array(path[::-1]).T
    return rows, cols


def word_groups(n_text: int, decode) -> tuple[list[str], list[list[int]]]:
    """Text token positions -> words: whole characters first (a multi-byte character may span
    tokens), then a word per leading space or punctuation mark, as Whisper splits English."""
    pieces, groups, current = [], [], []
    for i in range(n_text):
        current.append(i)
        text = decode(current)
        if "\ufffd" not in text:
            pieces.append(text)
            groups.append(current)
            current = []
    words, word_tokens = [], []
    for text, group in zip(pieces, groups):
        if text.startswith(" ") or text.strip() in APPENDED + PREPENDED or not words:
            words.append(text)
            word_tokens.append(list(group))
        else:
            words[-1] += text
            word_tokens[-1].extend(group)
    return words, word_tokens


def word_times(weights: np.ndarray, skip: int, audio_frames: int, text_probs: np.ndarray, decode) -> list[Word]:
    """Words with start / end seconds from the alignment heads (Whisper's `find_alignment` and
    its punctuation merge and long-word clamp)."""
    matrix = alignment_matrix(weights, skip, audio_frames)     # [n_text + 1, frames]
    rows, cols = dtw(-matrix)
    words, word_tokens = word_groups(len(text_probs), decode)
    bounds = np.concatenate([[0], np.cumsum([len(t) for t in word_tokens])])
    jumps = np.concatenate([[True], np.diff(rows) > 0])       # the first frame of each row
    jump_times = cols[jumps] / FRAMES_PER_SECOND
    out = [Word(w, float(jump_times[a]), float(jump_times[b]), float(np.mean(text_probs[a:b])), list(range(a, b)))
           for w, a, b in zip(words, bounds[:-1], bounds[1:])]
    durations = np.array([w.end - w.start for w in out])
    durations = durations[durations > 0]
    if len(durations):
        longest = 2 * min(MAX_MEDIAN_WORD, float(np.median(durations)))
        for prev, w in zip(out, out[1:]):
            if w.end - w.start > longest:
                if w.text.strip() in SENTENCE_END:
                    w.end = w.start + longest
                elif prev.text.strip() in SENTENCE_END:
                    w.start = w.end - longest
    return merge_punctuation(out)


def merge_punctuation(words: list[Word]) -> list[Word]:
    """Opening marks join the next word, closing marks the previous one (their times dropped)."""
    words = [Word(w.text, w.start, w.end, w.probability, list(w.tokens)) for w in words]
    j = len(words) - 1                     # the word an opening mark joins
    for i in range(len(words) - 2, -1, -1):
        w, nxt = words[i], words[j]
        if w.text.startswith(" ") and w.text.strip() in PREPENDED:
            nxt.text, nxt.tokens = w.text + nxt.text, w.tokens + nxt.tokens
            w.text, w.tokens = "", []
        else:
            j = i
    keep = 0
    for j in range(1, len(words)):
        prev, w = words[keep], words[j]
        if not prev.text.endswith(" ") and w.text and w.text in APPENDED:
            prev.text, prev.tokens = prev.text + w.text, prev.tokens + w.tokens
            w.text, w.tokens = "", []
        else:
            keep = j
    return [w for w in words if w.text]


def last_word_to_silence(words: list[Word], samples, rate: int = RATE) -> list[Word]:
    """The last word's end moved forward to where the sound falls silent (see SILENCE_DB), never
    earlier than the alignment put it, never past the audio or LAST_WORD_EXTRA."""
    if not words:
        return words
    x = np.abs(np.asarray(samples.numpy() if hasattr(samples, "numpy") else samples, dtype=np.float32))
    step = int(rate * 0.02)
    n = len(x) // step
    if n == 0 or not x.any():
        return words
    peaks = x[:n * step].reshape(n, step).max(1)
    loud = np.nonzero(20 * np.log10(np.maximum(peaks, 1e-12) / peaks.max()) > SILENCE_DB)[0]
    last = words[-1]
    heard_until = min((loud[-1] + 1) * step / rate, len(x) / rate, last.end + LAST_WORD_EXTRA)
    last.end = max(last.end, float(heard_until))
    return words
