"""Every limit a deployment may want to change, in one place.

Each value can be overridden by an environment variable `ATTNVIZ_<NAME>` (e.g.
`ATTNVIZ_MAX_TEXT_CHARS=20000 make run`), read from the environment once at import. Code reads
`LIMITS.<name>` when it runs, never a copy taken at import, so `override(...)` (tests, one process
serving several configurations) changes every reader at once. Streamlit's own upload cap lives in
`.streamlit/config.toml` (`server.maxUploadSize`, MB) and must agree with `max_upload_bytes`.
"""
from __future__ import annotations

import math
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
        raise ValueError(raw)
    return value in ("1", "true", "yes", "on")


def _env(name: str, default, cast):
    raw = os.environ.get(f"ATTNVIZ_{name}")
    if raw is None or raw.strip() == "":
        return default
    kind, cast = cast.__name__, (_bool if cast is bool else cast)
    try:
        value = cast(raw)
    except ValueError:
        raise ValueError(f"environment variable ATTNVIZ_{name}={raw!r} is not a valid "
                         f"{kind}") from None
    # NaN compares false with everything (a NaN limit would switch its check off); inf or a
    # negative count is no limit either
    if kind in ("int", "float") and not 0 <= value < math.inf:
        raise ValueError(f"environment variable ATTNVIZ_{name}={raw!r} must be a finite number of at least 0 "
                         f"(the default is {default!r})")
    return value


@dataclass(frozen=True)
class Limits:
    # text
    max_text_chars: int = 100_000       # refused before tokenizing
    attention_capture_mb: int = 128     # attention page: L*H*n*n floats captured at once; longer texts go
                                        # layer by layer into a pooled overview plus one exact window
    attention_window_tokens: int = 512  # detail views never show more tokens per axis than this
    live_max_tokens: int = 256          # heads page: tokens of the live comparison (both runs' log-probs)
    readout_max_tokens: int = 256       # readouts page: tokens of a logit lens / attribution / prompt pair
    max_generate_tokens: int = 64       # readouts page: the most tokens one generation writes
    max_generate_seconds: float = 60.0  # one generation stops (keeping what it has) after this
    lab_max_tokens: int = 512           # lab: tokens of the step-by-step view (several n x n steps)
    max_importance_tokens: int = 4096   # heads page: evaluation tokens of one importance / curve run
    # images
    max_upload_bytes: int = 20 * 10**6  # = server.maxUploadSize (20) x 10^6 in .streamlit/config.toml:
                                        # the browser widget counts MB as 10^6 bytes (2^20 on Windows),
                                        # so every file it lets through gets our message or is read
    max_image_pixels: int = 40_000_000  # decoded pixels; Pillow's bomb guard becomes a ValueError
    max_decoded_pixels: int = 16_000_000  # a larger upload is shrunk to this while it is decoded (Pillow's
                                        # box filter, before any mode conversion): no view draws more
                                        # (max_render_pixels), and an RGB image this size holds 64 MB:
                                        # a PNG or TIFF whose decode would take more is decoded in bands
                                        # (uploads.bands), or refused where it cannot be
    max_image_decodes: int = 2          # server-wide uploads decoded at once; one more is told the server is busy
    min_image_side: int = 112           # model input side offered in the app
    max_image_side: int = 448
    image_attention_mb: int = 512       # images page: resolutions whose attention weights exceed this are not offered
    # work budgets
    max_sweep_seconds: float = 600.0    # latency page: the most a sweep may be estimated to take
    max_sweep_memory_mb: float = 4096.0  # latency page: the most a sweep may be estimated to need
    max_train_seconds: float = 60.0     # lab: one toy training run
    max_lab_seconds: float = 120.0      # lab: one permutation test or variants measurement
    max_importance_seconds: float = 300.0  # heads page: the most one importance / curve run may take
                                        # (the page's budget box cannot go above it)
    max_capture_tokens: int = 2048      # attention page: a longer text is cut to this many tokens (said on the page)
    max_capture_seconds: float = 120.0  # attention page: a long text's capture stops (with a message) after this
    max_capture_mb: int = 512           # any view: attention weights one capture holds (base.memory decides,
                                        # before it runs, to capture in chunks or refuse, saying what to shorten)
    max_memory_mb: int = 0              # server-wide: a job that would push the process past this is refused
                                        # before it starts (0: three quarters of the machine's memory)
    max_heavy_jobs: int = 2             # server-wide: importance runs, sweeps, trainings, long captures at once;
                                        # a session asking for one more is told the server is busy
    # translation (en-pt, pt-en and local marian / bart folders)
    max_source_tokens: int = 256        # a longer source is cut to this many tokens (said on the page)
    max_target_tokens: int = 512        # decoding also stops at 2.5 x source + 5 tokens, whichever is less
    max_translate_seconds: float = 30.0  # one translation stops (keeping what it has) after this
    heavy_beam_tokens: int = 64         # a beam search over a longer source holds a heavy-job slot
    # speech (whisper-tiny-en): refused from the header, before anything is decoded
    max_audio_bytes: int = 20 * 10**6   # one uploaded WAV / FLAC (= the browser's upload cap)
    max_audio_seconds: float = 120.0    # longer is refused; beyond Whisper's 30 s window the page keeps 30 s
    max_transcribe_seconds: float = 60.0  # one transcription stops (keeping what it has) after this
    # images: refused beyond this aspect ratio; every rendered picture is capped at this many pixels
    max_image_aspect: float = 20.0
    max_render_pixels: int = 16_000_000
    # local model folders: refused before reading when bigger than these
    max_config_bytes: int = 1 * 2**20   # config.json, tokenizer_config.json, ...
    max_weight_bytes: int = 8 * 2**30   # all weight files of one folder together
    # caches (st.cache_resource max_entries): models, and large per-input results (traces, captures)
    model_cache_entries: int = 4        # per-model derived results (e.g. the heads' means)
    model_cache_mb: int = 4096          # the shared models' weights (all seven bundled: ~2.3 GB)
    trace_cache_entries: int = 4
    result_cache_mb: int = 768          # app: each server-wide cache of per-text results (all sessions)
    # torch threads per server process (0: torch's default, one per core). On a shared server
    # with many sessions, 1 avoids oversubscribing the cores with every rerun's thread pool.
    torch_threads: int = 0
    # oneDNN-prepacked linear weights for inference: faster traces for a second copy of the weights
    packed_linear: bool = True
    # deployments: local checkpoint folders users may load from the app. "" (the default) = the app
    # offers no local folders at all; the library and CLI still load any folder their caller names.
    allowed_model_dirs: str = ""        # os.pathsep-separated list of folders
    # models by name ("org/name"): always read from the Hugging Face cache; downloaded only with
    # hub on, for names matching one of hub_allow's comma-separated patterns ("Qwen/*,meta-llama/*")
    hub: bool = False
    hub_allow: str = ""

    @classmethod
    def from_env(cls) -> "Limits":
        values = {}
        for f in fields(cls):
            default = f.default
            values[f.name] = _env(f.name.upper(), default, type(default))
        return cls(**values)

    def allowed_dirs(self) -> list[Path]:
        """The allow-list's folders, resolved (symlinks and `..` followed). An entry that cannot be
        resolved (a symlink loop, a user name `~x` that does not exist) allows nothing."""
        out = []
        for entry in self.allowed_model_dirs.split(os.pathsep):
            if entry.strip():
                try:
                    out.append(Path(entry.strip()).expanduser().resolve())
                except (OSError, RuntimeError, ValueError):
                    continue
        return out

    def check_model_dir(self, folder: str | Path, required: bool = False) -> Path:
        """The resolved folder, if this deployment lets it be loaded.

        With an allow-list set, the folder's resolved path (symlinks and `..` followed) must be an
        existing folder inside one of the allowed folders; a relative name is looked up inside them.
        Every refusal (outside, missing, not a folder, unreadable, a symlink loop) gets the same
        message, which names only what the caller typed, never where it leads, so a remote user
        learns nothing about the rest of the server. `required=True` (the app) refuses everything
        when no allow-list is set; the library and CLI default to any folder their caller names.
        """
        typed = str(folder)
        roots = [e.strip() for e in self.allowed_model_dirs.split(os.pathsep) if e.strip()]
        if not roots:
            if required:
                raise ValueError("this server loads no local model folders (its operator can allow "
                                 "some with ATTNVIZ_ALLOWED_MODEL_DIRS)")
            try:
                return Path(folder).expanduser().resolve()
            except (OSError, RuntimeError, ValueError):
                raise ValueError(f"{typed!r} is not a folder that can be loaded") from None
        allowed = self.allowed_dirs()  # may be empty when no entry resolves: then nothing is allowed
        refusal = ValueError(f"this deployment only loads model folders under {', '.join(roots)}: "
                             f"{typed!r} is not a folder there")
        try:
            path = Path(folder).expanduser()
            candidates = [path] if path.is_absolute() else [root / path for root in allowed]
            if not path.is_absolute() and not required:
                candidates.append(path)  # the library: relative to the working folder, too
            for candidate in candidates:
                resolved = candidate.resolve()
                if any(resolved == a or a in resolved.parents for a in allowed) and resolved.is_dir():
                    return resolved
        except (OSError, RuntimeError, ValueError):
            pass
        raise refusal


def sizes(n_bytes: int, limit_bytes: int) -> tuple[str, str]:
    """A size over its limit and the limit, in MB (10^6 bytes, as the upload widget counts), with as
    many decimals as it takes for the two to differ: never "20.0 MB; the limit is 20.0 MB"."""
    for digits in (1, 3, 6):  # at 6 decimals one byte shows
        pair = f"{n_bytes / 1e6:,.{digits}f} MB", f"{limit_bytes / 1e6:,.{digits}f} MB"
        if pair[0] != pair[1] or digits == 6:
            return pair


class _InForce:
    """`LIMITS.x`: the value in force now (the environment's, or an `override`'s)."""

    def __getattr__(self, name: str):
        return getattr(_stack[-1], name)

    def __repr__(self) -> str:
        return f"LIMITS({_stack[-1]!r})"

    @property
    def current(self) -> Limits:
        return _stack[-1]


_stack: list[Limits] = [Limits.from_env()]
_lock = threading.Lock()
LIMITS = _InForce()


@contextmanager
def override(**changes):
    """Change some limits for the duration of a `with` block, for every module at once:
    `with override(max_text_chars=10): ...`. Unknown names are a TypeError."""
    with _lock:
        _stack.append(replace(_stack[-1], **changes))
        pushed = _stack[-1]
    try:
        yield pushed
    finally:
        with _lock:
            _stack.remove(pushed)
