"""Safe image input: uploaded bytes -> checked 8-bit RGB pixels, and the sample photos.

`open_image` is the one door through which uploaded bytes become pixels: it caps the file size
and the pixel count (read from the header, before anything is decoded), accepts only a short list
of formats, shrinks what is larger than LIMITS.max_decoded_pixels while decoding, and turns every
colour mode Pillow can produce into plain 8-bit RGB (`attnviz.uploads.colour`); a large PNG or TIFF
is decoded a band of rows at a time (`attnviz.uploads.bands`), so its full-size pixels never exist.
Every refusal is a ValueError whose message says what was wrong and what to do. At most
LIMITS.max_image_decodes decodes run at once, server-wide; bytes that failed once fail again at
once (remembered by their SHA-256), without being decoded again.

Nothing here touches Pillow's global settings (`Image.MAX_IMAGE_PIXELS`,
`ImageFile.LOAD_TRUNCATED_IMAGES`): one process serves many browser sessions at once, and a
global changed for one upload would race with another.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import logging
import re
import threading
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

from PIL import Image, ImageOps, UnidentifiedImageError

from attnviz.base.limits import LIMITS
from attnviz.uploads.bands import DECODE_ERRORS, TooLargeToDecode, decode_in_bands
from attnviz.uploads.colour import ORIENTATION, sample_range, shrink_factor, shrink_to_rgb, strips, to_rgb

logger = logging.getLogger(__name__)

# Limits, named so that a later single place for all limits can import them.
# The bounds are LIMITS' (read when called): max_upload_bytes 20 MB (decimal), larger than any photo a
# phone takes; max_image_pixels 40 Mpx (RGBA at this size is 160 MB); max_image_aspect 20:1 (a 1 x 640
# strip has no picture to attend to); min/max_image_side 112-448 px model input (448 px: 1025 tokens).

# Pillow format ids we let Pillow try. Restricting `formats` means no other plugin's code runs
# on uploaded bytes at all (in particular EPS, whose loader would start Ghostscript).
# The JPEG entry also opens MPO, the multi-picture JPEG many cameras write (Pillow has no
# separate "MPO" opener; naming one would raise KeyError inside Image.open).
ACCEPTED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
_ACCEPTED_NAMES = "PNG, JPEG, WebP, GIF, BMP or TIFF"

# Leading bytes of formats, so that a refusal can name what the file is.
_ACCEPTED_MAGIC = {
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"\xff\xd8\xff": "JPEG",
    b"GIF87a": "GIF",
    b"GIF89a": "GIF",
    b"BM": "BMP",
    b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
}
_REFUSED_MAGIC = {
    b"8BPS": "Photoshop (PSD)",
    b"%PDF": "PDF",
    b"%!PS": "PostScript/EPS",
    b"\xc5\xd0\xd3\xc6": "EPS",
    b"\x00\x00\x01\x00": "ICO",
    b"\x00\x00\x00\x0cjP  ": "JPEG 2000",
    b"\xff\x4f\xff\x51": "JPEG 2000",
    b"qoif": "QOI",
    b"\x76\x2f\x31\x01": "OpenEXR",
    b"PK\x03\x04": "ZIP archive",
}
_ISOBMFF_BRANDS = {b"heic": "HEIC", b"heix": "HEIC", b"mif1": "HEIF", b"avif": "AVIF"}


# Failed decodes, remembered by the file's SHA-256 and the bounds it was read under: a message
# each (a few hundred bytes), the oldest forgotten first.
REMEMBERED_FAILURES = 256
_failures: OrderedDict[tuple, str] = OrderedDict()
_failures_lock = threading.Lock()
_decoding = 0                 # decodes running now, server-wide
_decoding_lock = threading.Lock()


class DecodersBusy(ValueError):
    """Every decode slot is taken: the upload is not refused, only deferred (never remembered)."""


@contextmanager
def decode_slot():
    """Hold one of the LIMITS.max_image_decodes decode slots; DecodersBusy when none is free."""
    global _decoding
    with _decoding_lock:
        if _decoding >= LIMITS.max_image_decodes:
            raise DecodersBusy("The server is busy; upload the image again in a moment.")
        _decoding += 1
    try:
        yield
    finally:
        with _decoding_lock:
            _decoding -= 1


# Upload → RGB
# --------------------------------------------------------------------------------------------


def open_image(
    data: bytes,
    *,
    max_bytes: int | None = None,
    max_pixels: int | None = None,
    max_aspect: float | None = None,
) -> Image.Image:
    """Decode the bytes of an uploaded file into a fully loaded 8-bit RGB image.

    Applies the EXIF orientation, takes the first frame of an animation, puts transparency on
    white, and shrinks an image of more than LIMITS.max_decoded_pixels by a whole factor (a JPEG
    is decoded at that scale, a PNG or TIFF a band of rows at a time, each band box-filtered before
    any conversion). Raises ValueError saying why for empty, oversized, truncated, corrupt,
    non-image or unsupported files, for images whose longer side is more than `max_aspect` times
    the shorter one (read from the header, before decoding), and for a PNG or TIFF that cannot be
    decoded in bands (interlaced, a few huge strips) whose pixels would take more than
    `bands.decode_budget()` bytes (4 bytes a pixel of LIMITS.max_decoded_pixels). `max_bytes` counts bytes exactly: a
    file of `max_bytes` is accepted, one byte more is refused. `max_pixels` above Pillow's own
    bomb limit (2 x 89 Mpx) has no effect: Pillow refuses those first, and we do not raise its
    global limit. Each bound defaults to its LIMITS value. When every decode slot is taken it
    raises `DecodersBusy` (a ValueError) saying so.
    """
    max_bytes = LIMITS.max_upload_bytes if max_bytes is None else max_bytes
    max_pixels = LIMITS.max_image_pixels if max_pixels is None else max_pixels
    max_aspect = LIMITS.max_image_aspect if max_aspect is None else max_aspect
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"open_image expects the file's bytes, got {type(data).__name__}")
    data = bytes(data)
    if not data:
        raise ValueError("The file is empty (0 bytes): upload a PNG, JPEG, WebP, GIF, BMP or TIFF.")
    if len(data) > max_bytes:
        raise ValueError(
            f"The file is {len(data):,} bytes, over the limit of {max_bytes:,} bytes "
            f"({_megabytes(max_bytes)}): save it smaller (e.g. as JPEG) and upload again."
        )
    key = (hashlib.sha256(data).digest(), max_pixels, max_aspect, LIMITS.max_decoded_pixels)
    with _failures_lock:
        known = _failures.get(key)
    if known is not None:
        raise ValueError(known)
    with decode_slot():
        try:
            return _decode(data, max_pixels, max_aspect)
        except ValueError as err:
            with _failures_lock:
                _failures[key] = str(err)
                while len(_failures) > REMEMBERED_FAILURES:
                    _failures.popitem(last=False)
            raise


def _decode(data: bytes, max_pixels: int, max_aspect: float) -> Image.Image:
    try:
        # Image.open reads only the header; pixels are decoded by load() below.
        image = Image.open(io.BytesIO(data), formats=list(ACCEPTED_FORMATS))
    except UnidentifiedImageError:
        raise ValueError(_describe_unidentified(data)) from None
    except Image.DecompressionBombError as err:
        # Pillow's hard limit (2 x its MAX_IMAGE_PIXELS) fired inside open(), before we could
        # read the size; its message holds the pixel count.
        declared = re.search(r"\((\d+) pixels\)", str(err))
        count = f"{int(declared.group(1)):,} pixels" if declared else "too many pixels"
        raise ValueError(
            f"The image is {count} according to its header, over the limit of {max_pixels:,} "
            "pixels (a possible decompression bomb): resize it before uploading."
        ) from None
    except Image.DecompressionBombWarning as err:  # only raised when warnings are errors
        raise ValueError(f"The image is too large to open safely ({err}).") from None
    except DECODE_ERRORS as err:
        raise ValueError(_describe_decode_error(err, data)) from None

    with image:
        width, height = image.size
        if width * height > max_pixels:
            raise ValueError(
                f"The image is {width}×{height} = {width * height:,} pixels, over the limit of "
                f"{max_pixels:,} pixels: resize it before uploading."
            )
        check_aspect(width, height, max_aspect)
        if width * height > LIMITS.max_decoded_pixels and (
                image.format == "WEBP" or image.info.get("progressive")):
            raise TooLargeToDecode(whole_decode_refusal(image))
        factor = shrink_factor(width, height, LIMITS.max_decoded_pixels)
        try:
            banded = decode_in_bands(image, data, factor)  # a large PNG or TIFF never exists whole
            if banded is not None:
                return banded
            if factor > 1 and image.format == "JPEG":  # decoded at 1/2, 1/4 or 1/8 scale
                image.draft(image.mode, (-(-width // factor), -(-height // factor)))
            # An animation opens on its first frame; load() decodes just that frame.
            image.load()
            factor = shrink_factor(*image.size, LIMITS.max_decoded_pixels)  # a JPEG: what draft left
            if factor == 1:  # exif_transpose copies even an upright image: only a turned one goes in
                turned = image.getexif().get(ORIENTATION, 1) != 1
                oriented = ImageOps.exif_transpose(image) if turned else image
            else:  # shrunk and converted a strip at a time, oriented as the EXIF of the whole says
                levels = sample_range(image) if image.mode in ("I", "F") else None
                return shrink_to_rgb(strips(image, factor), image.size, factor, levels,
                                     image.getexif().get(ORIENTATION, 1))
        except TooLargeToDecode:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
            raise ValueError(f"The image is too large to open safely ({err}).") from None
        except DECODE_ERRORS as err:
            raise ValueError(_describe_decode_error(err, data)) from None
    del image  # closing keeps Pillow's pixels: the full-size decode goes only now
    return to_rgb(oriented)


# Formats Pillow can only decode at full size whatever we keep, and their peak bytes a pixel:
# libwebp's animation decoder (Pillow's WebP reader) holds two full-size RGBA canvases (40 Mpx
# took 640 MB); a progressive JPEG keeps every DCT coefficient of the whole image even when
# libjpeg scales it down (40 Mpx took 161 MB, a baseline JPEG 40 MB). Only those within the cap
# (not shrunk) are decoded.
WHOLE_DECODES = {"WEBP": ("WebP", 16, "a JPEG or PNG, or as a WebP"),
                 "JPEG": ("progressive JPEG", 4, "a baseline (not progressive) JPEG or a PNG, or")}


def whole_decode_refusal(image: Image.Image) -> str:
    name, per_pixel, advice = WHOLE_DECODES[image.format]
    pixels = image.width * image.height
    return (f"This {pixels / 1e6:.3g}-megapixel {name} would need about {per_pixel * pixels / 1e6:,.0f} MB "
            f"to decode (it is decoded whole, at full size): save it as {advice} of at most "
            f"{LIMITS.max_decoded_pixels / 1e6:.3g} megapixels, and upload it again.")


def check_aspect(width: int, height: int, max_aspect: float | None = None) -> None:
    """Refuse an image whose longer side is more than `max_aspect` times its shorter side.

    Such strips have almost nothing to squeeze into a square model input, and every picture
    drawn at a sensible width from them is enormously tall (a 1 x 640 strip as 224-px-wide
    tiles is 143,000 px tall)."""
    max_aspect = LIMITS.max_image_aspect if max_aspect is None else max_aspect
    short, long = min(width, height), max(width, height)
    if short < 1:
        raise ValueError(f"The image is {width}×{height} px and has no pixels: upload a photo.")
    if long > max_aspect * short:
        raise ValueError(
            f"The image is {width}×{height} px, {long / short:.1f} times as "
            f"{'tall' if height > width else 'wide'} as it is {'wide' if height > width else 'tall'}: "
            f"the limit is {max_aspect:g}:1. Crop it closer to square and upload it again."
        )


def _megabytes(count: int) -> str:
    """'20 MB' for 20,000,000 bytes (decimal megabytes, as the upload widget counts them)."""
    return f"{count / 10**6:g} MB"


def _describe_unidentified(data: bytes) -> str:
    """Say what the bytes look like when no accepted format recognised them."""
    head = data[:32]
    for magic, name in _REFUSED_MAGIC.items():
        if head.startswith(magic):
            return f"{name} files are not supported: save the picture as PNG or JPEG and upload it."
    if head[4:8] == b"ftyp" and head[8:12] in _ISOBMFF_BRANDS:
        name = _ISOBMFF_BRANDS[head[8:12]]
        return f"{name} files are not supported: save the picture as PNG or JPEG and upload it."
    for magic, name in _ACCEPTED_MAGIC.items():
        if head.startswith(magic):
            return (
                f"The file starts like a {name} but its header is truncated or corrupt: "
                "upload the complete file again."
            )
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "The file starts like a WebP but is truncated or corrupt: upload it again."
    if _looks_like_text(data):
        if b"<svg" in data[:4096].lower():
            return "SVG files are not supported: export the picture as PNG and upload it."
        return f"This is not an image but a text file: upload a {_ACCEPTED_NAMES} picture."
    return f"This is not an image in a supported format: upload a {_ACCEPTED_NAMES} picture."


def _describe_decode_error(err: BaseException, data: bytes) -> str:
    text = str(err)
    if "truncated" in text.lower() or isinstance(err, EOFError):
        return (
            f"The file is truncated ({len(data):,} bytes, the image data stops early): "
            "upload the complete file again."
        )
    reason = text or type(err).__name__
    return f"The image data is corrupt or unreadable ({reason}): upload it again."


def _looks_like_text(data: bytes) -> bool:
    decoded = data[:4096].decode("utf-8", errors="replace")
    # U+FFFD marks bytes that are not UTF-8 (binary data, or a character cut at the end).
    readable = sum((ch.isprintable() or ch in "\r\n\t") and ch != "\ufffd" for ch in decoded)
    return readable / len(decoded) > 0.95


# Sample photos (scikit-image, BSD-3-Clause)
# --------------------------------------------------------------------------------------------

_SAMPLE_FILES = {
    "cat": "chelsea.png",
    "coffee": "coffee.png",
    "astronaut": "astronaut.png",
    "rocket": "rocket.jpg",
    "motorcycle": "motorcycle_left.png",
}


def sample_images() -> dict[str, Path]:
    """Name → path of the sample photos that ship inside the installed scikit-image."""
    # find_spec locates the package without importing it (skimage's import is slow).
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        logger.warning("scikit-image is not installed: no sample images")
        return {}
    data_dir = Path(next(iter(spec.submodule_search_locations))) / "data"
    found = {name: data_dir / file for name, file in _SAMPLE_FILES.items()}
    return {name: path for name, path in found.items() if path.is_file()}


def load_sample(name: str) -> Image.Image:
    """One sample photo as an RGB image, read through the same checks as an upload."""
    samples = sample_images()
    if name not in samples:
        raise ValueError(f"Unknown sample image {name!r}; choose one of {sorted(samples)}.")
    return open_image(samples[name].read_bytes())
