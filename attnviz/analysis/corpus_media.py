"""Uploaded audio and image corpora, held as the files' bytes and decoded one item at a time.

Decoded pixels and samples are far larger than the files: 2,000 one-colour 448 x 448 PNGs (2.5 MB)
are 1.2 GB of pixels, 5 MB of FLAC hundreds of MB of samples. So an uploaded corpus keeps each
file's bytes (a `MediaItem`, bounded by the corpus' byte limit) and is bounded by what it decodes
to (`CorpusLimits.max_decoded_bytes`); opening it decodes each file once, alone, to check it and
measure it, and a run decodes each item again when its turn comes (`ready_item`), in the process
that runs it. Before every decode the server's memory guard (`base.memory.check_room`) is asked
for what that decode may take, read from the file's header.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
from PIL import Image

from attnviz.base import memory
from attnviz.base.limits import LIMITS
from attnviz.uploads.audio import read_audio
from attnviz.uploads.images import open_image

MAX_IMAGE_SIDE = 448       # photos are kept at most this large: the run resizes to the model's side anyway
MAX_AUDIO_SECONDS = 30.0   # one Whisper window; longer clips keep their first 30 s (with a note)
AUDIO_SUFFIXES = (".wav", ".flac")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff")


@dataclass(frozen=True)
class MediaItem:
    """One uploaded file of a corpus: its bytes, and the bytes its decoded item takes."""
    name: str
    kind: str                   # "audio" | "image"
    data: bytes
    decoded_bytes: int


def _decode_need(kind: str, data: bytes) -> int:
    """What decoding `data` may hold at once, from its header (0 when the header is unreadable: the
    decode then fails with its own message before it allocates)."""
    try:
        if kind == "image":
            with Image.open(io.BytesIO(data)) as image:
                return min(image.size[0] * image.size[1], LIMITS.max_decoded_pixels) * 4
        info = sf.info(io.BytesIO(data))
        frames = min(info.frames, int(MAX_AUDIO_SECONDS * info.samplerate) + 1)
        return frames * info.channels * 4 + int(MAX_AUDIO_SECONDS * 16_000) * 4
    except Exception:  # noqa: BLE001 - any unreadable header: the decode says what is wrong
        return 0


def image_array(data: bytes) -> np.ndarray:
    image = open_image(data)
    if max(image.size) > MAX_IMAGE_SIDE:
        image.thumbnail((MAX_IMAGE_SIDE, MAX_IMAGE_SIDE))
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


def _decode(name: str, kind: str, data: bytes) -> tuple[np.ndarray, float]:
    """(item, seconds cut) of one file, after the memory guard allowed its decode."""
    memory.check_room(f"decoding {name}", _decode_need(kind, data))
    try:
        if kind == "audio":
            heard = read_audio(data, cut=True, max_seconds=MAX_AUDIO_SECONDS)
            return heard.samples, heard.truncated_seconds
        return image_array(data), 0.0
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None


def ready_item(item):
    """The item a model reads: a MediaItem decoded now (the memory guard asked first); else as is."""
    if isinstance(item, MediaItem):
        return _decode(item.name, item.kind, item.data)[0]
    return item


def media_items(named: list, kind: str, limits) -> tuple[list[MediaItem], list[str]]:
    """The files (name, bytes or Path) as MediaItems within the row, byte and decoded-byte limits,
    each checked by decoding it alone; notes say what was cut."""
    notes, items, total, decoded = [], [], 0, 0
    if len(named) > limits.max_rows:
        notes.append(f"kept the first {limits.max_rows:,} of {len(named):,} files (the row limit)")
        named = named[:limits.max_rows]
    for i, (name, data) in enumerate(named):
        data = data.read_bytes() if isinstance(data, Path) else bytes(data)
        if total + len(data) > limits.max_bytes:
            notes.append(f"kept {i:,} of {len(named):,} files: the next would pass {limits.max_bytes:,} bytes")
            break
        array, cut = _decode(name, kind, data)
        if decoded + array.nbytes > limits.max_decoded_bytes:
            notes.append(f"kept {i:,} of {len(named):,} files: the next would decode past "
                         f"{limits.max_decoded_bytes / 1e6:,.0f} MB of {'samples' if kind == 'audio' else 'pixels'}")
            break
        if cut:
            notes.append(f"{name}: kept the first {MAX_AUDIO_SECONDS:.0f} s")
        total, decoded = total + len(data), decoded + array.nbytes
        items.append(MediaItem(name, kind, data, int(array.nbytes)))
        del array               # one decoded item at a time, never the corpus
    return items, notes
