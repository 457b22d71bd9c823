"""Audio in: WAV / FLAC bytes or a float array -> checked 16 kHz mono samples, and their log-mel.

Decoding is libsndfile's (`soundfile`), resampling scipy's polyphase filter, the log-mel
spectrogram transformers' `WhisperFeatureExtractor` (the features Whisper was trained on). Every
check runs on the header before anything is decoded, so a hostile file costs neither memory nor
time: size, format, rate, channels and length are bounded by `LIMITS`, read at call time. Every
refusal is a ValueError that says what to do.
"""
from __future__ import annotations

import functools
import io
import math
import struct
from dataclasses import dataclass

import numpy as np
import soundfile as sf
import torch
# scipy.signal and transformers' feature extractor are imported where audio is first decoded
# (they take ~1.5 s to import): a server whose first page is not Speech never pays for them.

from attnviz.base.limits import LIMITS, sizes

RATE = 16_000
FORMATS = {"WAV": "WAV", "WAVEX": "WAV", "RF64": "WAV", "FLAC": "FLAC"}
MIN_RATE, MAX_RATE = 4_000, 384_000
# resample_poly's filter has ~20 x max(up, down) taps for the reduced ratio up / down = 16 kHz / rate:
# every standard rate (8 to 384 kHz, 44.1 kHz's 160 / 441, NTSC's 44,056 Hz 2,000 / 5,507) stays far
# below this, while a prime rate such as 383,987 Hz (16,000 / 383,987) needs ~7.7 M taps: hundreds of MB
# and seconds of CPU for one upload
MAX_RESAMPLE_TERM = 10_000
MAX_CHANNELS = 8
MIN_SECONDS = 0.1             # shorter is no speech
SILENT_PEAK = 1e-4            # peak level under which a recording holds nothing to hear (-80 dBFS)
CLIPPED_LEVEL = 0.999         # |sample| at or above: at full scale
CLIPPED_SHARE = 0.05          # more than this share of samples at full scale: overdriven noise
UNKNOWN_SIZE = (0, 0xFFFFFFFF)  # streaming writers leave the data size open: libsndfile reads to the end


@dataclass
class Audio:
    samples: np.ndarray        # [n] float32 mono at 16 kHz
    source_rate: int           # the file's (or caller's) sample rate before resampling
    channels: int              # before the downmix
    seconds: float             # the whole input's length
    truncated_seconds: float = 0.0  # cut from the end to fit `max_seconds` (0: nothing cut)
    format: str = "array"      # WAV | FLAC | array

    @property
    def duration(self) -> float:
        return len(self.samples) / RATE


def check_resampling(rate: int):
    """ValueError when resampling `rate` to 16 kHz would cost more than any standard rate does (the
    reduced ratio's terms bound the filter's length), said before anything is decoded."""
    g = math.gcd(RATE, rate)
    up, down = RATE // g, rate // g
    if max(up, down) > MAX_RESAMPLE_TERM:
        raise ValueError(f"the file's rate, {rate:,} samples per second, resamples to 16 kHz only as "
                         f"{up:,} / {down:,}, a filter of ~{20 * max(up, down):,} taps; export it at a standard "
                         "rate (16, 22.05, 44.1, 48 or 96 kHz)")


def _check_wav_length(raw: bytes):
    """A RIFF/WAVE file's `data` chunk must not claim more bytes than the file holds (libsndfile
    silently reads what is there: a cut-off or lying file would pass as shorter audio)."""
    if raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        return
    pos = 12
    while pos + 8 <= len(raw):
        chunk, size = raw[pos:pos + 4], struct.unpack("<I", raw[pos + 4:pos + 8])[0]
        if chunk == b"data":
            held = len(raw) - pos - 8
            if size not in UNKNOWN_SIZE and size > held:
                raise ValueError(f"the WAV header says its sound data is {size:,} bytes but the file holds "
                                 f"{held:,}: the file was cut short or its header is wrong. Export it again.")
            return
        pos += 8 + size + (size & 1)  # chunks are padded to an even length


def _bounded_seconds(seconds: float, cut: bool, max_seconds: float) -> float:
    """Seconds to keep; ValueError beyond the hard limit, or beyond max_seconds without `cut`."""
    limit = LIMITS.max_audio_seconds
    if seconds > limit:
        raise ValueError(f"the audio is {seconds:.1f} s long; the limit is {limit:.0f} s. Cut it shorter.")
    if seconds > max_seconds and not cut:
        raise ValueError(f"the audio is {seconds:.1f} s long; Whisper hears {max_seconds:.0f} s at a time. "
                         f"Cut it to {max_seconds:.0f} s or less (or pass cut=True to keep the first "
                         f"{max_seconds:.0f} s).")
    return min(seconds, max_seconds)


def _decode(raw: bytes, cut: bool, max_seconds: float) -> tuple[np.ndarray, int, int, float, str]:
    if len(raw) == 0:
        raise ValueError("the file is empty (0 bytes); upload a WAV or FLAC recording")
    if len(raw) > LIMITS.max_audio_bytes:
        size, limit = sizes(len(raw), LIMITS.max_audio_bytes)
        raise ValueError(f"the file is {size}; the limit is {limit}. "
                         "Upload a shorter recording (30 s of 16 kHz WAV is under 1 MB).")
    try:
        info = sf.info(io.BytesIO(raw))
    except (sf.LibsndfileError, RuntimeError, TypeError):
        raise ValueError("the file is not audio this app reads: upload a WAV or FLAC file") from None
    if info.format not in FORMATS:
        raise ValueError(f"the file is {info.format_info or info.format}; upload a WAV or FLAC file")
    if not MIN_RATE <= info.samplerate <= MAX_RATE:
        raise ValueError(f"the file says {info.samplerate:,} samples per second; readable rates are "
                         f"{MIN_RATE:,} to {MAX_RATE:,}")
    check_resampling(info.samplerate)
    if not 1 <= info.channels <= MAX_CHANNELS:
        raise ValueError(f"the file has {info.channels} channels; at most {MAX_CHANNELS} are read")
    if FORMATS[info.format] == "WAV":
        _check_wav_length(raw)
    seconds = info.frames / info.samplerate
    keep = _bounded_seconds(seconds, cut, max_seconds)
    frames = min(info.frames, math.ceil(keep * info.samplerate))
    try:
        data, rate = sf.read(io.BytesIO(raw), frames=frames, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError):
        raise ValueError("the file's sound data cannot be decoded; export it again as WAV or FLAC") from None
    return data, rate, info.channels, seconds, FORMATS[info.format]


def _array(x) -> tuple[np.ndarray, float]:
    try:
        a = np.asarray(x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x)
    except (TypeError, ValueError):
        raise ValueError("audio must be WAV/FLAC bytes or an array of float samples at 16 kHz") from None
    if a.dtype.kind not in "fiu" or a.ndim not in (1, 2) or a.size == 0:
        raise ValueError("audio must be WAV/FLAC bytes or a non-empty 1-D array of float samples at 16 kHz "
                         "(or [samples, channels])")
    if a.ndim == 2 and a.shape[1] > MAX_CHANNELS:
        raise ValueError(f"a 2-D array is [samples, channels] with at most {MAX_CHANNELS} channels; "
                         f"got {list(a.shape)}")
    if a.dtype.kind in "iu":  # PCM integers: scale to [-1, 1]
        a = a.astype(np.float32) / float(2 ** (8 * a.dtype.itemsize - 1))
    return a.reshape(len(a), -1).astype(np.float32, copy=False), len(a) / RATE


def read_audio(x, *, rate: int = RATE, cut: bool = False, max_seconds: float = 30.0) -> Audio:
    """Checked mono samples at 16 kHz from WAV/FLAC bytes (any readable rate, any channels,
    downmixed and resampled) or a float array at `rate`. Longer than `max_seconds`: ValueError,
    or with `cut` the first `max_seconds` kept (`truncated_seconds` says how much went)."""
    if isinstance(x, (bytes, bytearray, memoryview)):
        data, rate, channels, seconds, fmt = _decode(bytes(x), cut, max_seconds)
    else:
        if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
            raise ValueError(f"rate must be a whole number of samples per second, {MIN_RATE:,} to {MAX_RATE:,}")
        check_resampling(rate)
        data, _ = _array(x)
        seconds, fmt = len(data) / rate, "array"
        keep = _bounded_seconds(seconds, cut, max_seconds)
        data, channels = data[:math.ceil(keep * rate)], data.shape[1]
    if not np.isfinite(data).all():
        raise ValueError("the audio holds NaN or infinite samples")
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]   # [n, channels] -> [n]
    if rate != RATE:
        g = math.gcd(RATE, rate)
        from scipy.signal import resample_poly
        mono = resample_poly(mono, RATE // g, rate // g).astype(np.float32)
    if len(mono) < MIN_SECONDS * RATE:
        raise ValueError(f"the audio is {len(mono) / RATE:.2f} s long; give at least {MIN_SECONDS} s of speech")
    peak = float(np.abs(mono).max())
    if peak < SILENT_PEAK:
        raise ValueError(f"the audio is silent (peak level {20 * math.log10(max(peak, 1e-12)):.0f} dBFS): "
                         "there is nothing to transcribe. Check the microphone or the file.")
    clipped = float((np.abs(mono) >= CLIPPED_LEVEL).mean())
    if clipped > CLIPPED_SHARE:
        raise ValueError(f"{clipped:.0%} of the samples are at full scale: the recording is clipped "
                         "noise. Record again at a lower input level.")
    cut_s = max(0.0, seconds - max_seconds) if cut else 0.0
    return Audio(np.ascontiguousarray(mono, dtype=np.float32), rate, channels, seconds, cut_s, fmt)


@functools.lru_cache(maxsize=4)
def feature_extractor(n_mels: int):
    """transformers' WhisperFeatureExtractor for ``n_mels`` mel bands."""
    from transformers.models.whisper.feature_extraction_whisper import WhisperFeatureExtractor
    return WhisperFeatureExtractor(feature_size=n_mels)


def log_mel(samples: np.ndarray, n_mels: int = 80, n_samples: int = 30 * RATE) -> torch.Tensor:
    """[n_mels, n_samples / 160] log-mel frames of `samples`, padded with silence to one window."""
    fe = feature_extractor(n_mels)
    out = fe(samples, sampling_rate=RATE, return_tensors="np", max_length=n_samples)
    return torch.from_numpy(out["input_features"][0])
