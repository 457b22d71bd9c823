"""Decoded pixels -> plain 8-bit RGB, in bounded memory: shrinking before converting, and every
conversion a strip of rows at a time.

A 40 Mpx upload in a high-bit-depth mode (float32 or int32 TIFF, 16-bit or grey+alpha PNG) used to
peak at 1-2 GB while it became RGB: whole-image float64 copies, and RGBA compositing at full size.
Here an image is shrunk by an integer factor (Pillow's box filter, in C) to at most
LIMITS.max_decoded_pixels and converted a band of rows at a time, each band shrunk in its own mode
where Pillow can, straight into one RGB image: the work beyond the decoded pixels is that RGB image
(4 bytes a pixel in Pillow) plus one band. `attnviz.uploads.bands` feeds PNG and TIFF files here band
by band, so that the full-size image never exists at all.
"""
from __future__ import annotations

import math

import numpy as np
from PIL import Image

STRIP_PIXELS = 1 << 20       # pixels converted at once (a float64 strip: 8 MB)
HIGH_DEPTH = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")
# Modes Pillow's `reduce` box-filters in their own mode (LA and RGBA premultiplied by alpha, through
# a copy: one strip at a time here); the others (1, P, PA, I;16*) become RGB a strip at a time first.
REDUCIBLE = ("L", "LA", "La", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV", "I", "F")
ORIENTATION = 0x0112          # EXIF tag
TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
             4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
             6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE, 8: Image.Transpose.ROTATE_90}
_SWAPPING = (Image.Transpose.TRANSPOSE, Image.Transpose.ROTATE_270, Image.Transpose.TRANSVERSE,
             Image.Transpose.ROTATE_90)
_ROWS_TO_LEFT = (Image.Transpose.TRANSPOSE, Image.Transpose.ROTATE_90)  # row y becomes column y
_ROWS_STAY = (None, Image.Transpose.FLIP_LEFT_RIGHT)                   # row y stays row y


def shrink_factor(width: int, height: int, max_pixels: int) -> int:
    """The smallest integer factor that brings width x height to at most `max_pixels`."""
    factor = max(1, math.ceil(math.sqrt(width * height / max(1, max_pixels))))
    while math.ceil(width / factor) * math.ceil(height / factor) > max_pixels:
        factor += 1
    return factor


def strips(image: Image.Image, rows_multiple: int = 1):
    """(top, crop) for strips of a loaded image, about STRIP_PIXELS each, a multiple of
    `rows_multiple` rows but the last."""
    width, height = image.size
    rows = max(1, STRIP_PIXELS // max(1, width * rows_multiple)) * rows_multiple
    for top in range(0, height, rows):
        yield top, image.crop((0, top, width, min(height, top + rows)))


def shrink_to_rgb(bands, size: tuple[int, int], factor: int, levels: tuple[float, float] | None = None,
                  orientation: int = 1) -> Image.Image:
    """An image of `size`, given as bands of rows, made `factor` times smaller per side, 8-bit RGB
    and oriented (an EXIF orientation), one band at a time: the result is the only whole image.

    `bands` yields (top, image) in order, each a whole multiple of `factor` rows but the last, so
    the box filter is seamless. A mode with a box filter of its own is shrunk before it is
    converted; the others (1, P, PA, I;16*, anything with a transparent colour) after. 32-bit
    integer and float levels are mapped by `levels`, the (min, max) of the whole image."""
    width, height = math.ceil(size[0] / factor), math.ceil(size[1] / factor)
    method = TRANSPOSE.get(orientation)
    swapped = method in _SWAPPING
    out = Image.new("RGB", (height, width) if swapped else (width, height))
    for top, band in bands:
        if band.mode in REDUCIBLE and "transparency" not in band.info:
            small = to_rgb(band.reduce(factor) if factor > 1 else band, levels)
        else:
            small = to_rgb(band, levels)
            small = small.reduce(factor) if factor > 1 else small
        top, rows = top // factor, small.height
        if method is not None:
            small = small.transpose(method)
        if swapped:  # rows of the shrunk image become columns of the result
            out.paste(small, (top if method in _ROWS_TO_LEFT else height - top - rows, 0))
        else:
            out.paste(small, (0, top if method in _ROWS_STAY else height - top - rows))
    return out


def to_rgb(image: Image.Image, levels: tuple[float, float] | None = None) -> Image.Image:
    """Any Pillow mode → 8-bit RGB; transparency is composited on white.

    Returns `image` itself when it is already plain RGB, else a new image, built a strip of rows at
    a time. 32-bit integer and float levels are mapped by the (min, max) of the whole image
    (`levels`, given when `image` is a shrunk copy, taken from `image` otherwise).
    """
    if image.mode == "RGB" and "transparency" not in image.info:
        return image  # already right: no copy of a possibly large image
    if levels is None and image.mode in ("I", "F"):  # 16-bit levels are absolute: no range needed
        levels = sample_range(image)
    width, height = image.size
    if width * height <= STRIP_PIXELS:
        return _convert(image, levels)
    out = Image.new("RGB", image.size)
    for top, strip in strips(image):
        out.paste(_convert(strip, levels), (0, top))
    return out


def _convert(image: Image.Image, levels) -> Image.Image:
    mode = image.mode
    if mode in HIGH_DEPTH:
        # High bit depth grayscale: Pillow's own convert("L") clips instead of rescaling.
        return Image.fromarray(_to_uint8(np.asarray(image), levels)).convert("RGB")
    if mode == "CMYK":
        # Pillow's CMYK→RGB is a plain formula (no ICC profile): good enough to look at.
        return image.convert("RGB")
    if mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info:
        # P with a transparent index, L/RGB with a tRNS colour and real alpha all become RGBA;
        # premultiplied La converts only through LA.
        rgba = (image.convert("LA") if mode == "La" else image).convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    try:
        return image.convert("RGB")  # 1, L, P, RGBX, YCbCr, HSV, LAB (Pillow maps Lab to sRGB)
    except ValueError as err:
        raise ValueError(
            f"Colour mode {mode!r} cannot be shown; save the image as 8-bit RGB and upload again."
        ) from err


def sample_range(image: Image.Image) -> tuple[float, float]:
    """(min, max) of the finite samples (non-finite count as 0), read a strip at a time."""
    low, high = math.inf, -math.inf
    for _, strip in strips(image):
        samples = np.nan_to_num(np.asarray(strip).astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        low, high = min(low, float(samples.min())), max(high, float(samples.max()))
    return low, high


def _to_uint8(values: np.ndarray, levels: tuple[float, float] | None = None) -> np.ndarray:
    """Map integer or float grayscale samples to 0..255, given the whole image's (min, max).

    Unsigned 16-bit data keeps its absolute levels (x / 257, so 65535 → 255). Other data keeps
    its levels when it already fits a common range (floats in 0..1, anything in 0..255 or
    0..65535) and is stretched min..max otherwise.
    """
    if values.dtype.kind == "u" and values.dtype.itemsize == 2:  # I;16, I;16B, ...
        return np.round(values.astype(np.float64) / 257.0).astype(np.uint8)
    samples = np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    low, high = levels if levels is not None else (float(samples.min()), float(samples.max()))
    if np.issubdtype(values.dtype, np.floating) and low >= 0.0 and high <= 1.0:
        scaled = samples * 255.0
    elif low >= 0.0 and high <= 255.0:
        scaled = samples
    elif low >= 0.0 and high <= 65535.0:
        scaled = samples / 257.0
    elif high > low:
        scaled = (samples - low) * (255.0 / (high - low))
    else:
        scaled = np.zeros_like(samples)  # a constant image outside every range: no contrast
    return np.clip(np.round(scaled), 0, 255).astype(np.uint8)
