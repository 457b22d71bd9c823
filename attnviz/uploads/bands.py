"""PNG and TIFF uploads decoded a band of rows at a time, so that a large one never exists whole.

Pillow decodes a PNG or TIFF whole: a 40 Mpx float32 TIFF is 160 MB of pixels before anything can be
shrunk. It cannot decode part of one either: a decoder is bound to one image for good, and libtiff's
refuses a tile smaller than the file's image. So each band of rows is re-wrapped as a small file of
the same format, which Pillow decodes as usual:

- TIFF: a new IFD with the tags that say how to decode (compression, predictor, sample format, ...)
  that lists only the band's strips or tiles, their compressed bytes copied as they are: libtiff
  decodes exactly what it would have decoded for the whole file.
- PNG: the band's filtered rows, inflated here (zlib, streaming, a bounded piece at a time), under
  the header of a plain 8-bit PNG with the same bytes per pixel (the row filters work on bytes that
  far apart), led by the previous band's last row, unfiltered. Pillow undoes the filters and hands
  back the raw bytes, which `Image.frombytes` reads in the file's own rawmode. 16-bit RGB and RGBA
  (6 and 8 bytes a pixel) are unfiltered as two halves of 3 or 4 bytes: each byte's filter reads
  only the same byte of its neighbours.

Each band goes straight to `colour.shrink_to_rgb`, so the peak beyond the file is the RGB result
plus about one band. A file that cannot be banded (an interlaced or animated PNG, a TIFF stored as a
few huge strips) and whose pixels would need more than `decode_budget()` bytes is refused from its
header, saying what to do.
"""
from __future__ import annotations

import io
import math
import struct
import zlib

import numpy as np
from PIL import Image, TiffImagePlugin, TiffTags

from attnviz.base.limits import LIMITS
from attnviz.uploads.colour import ORIENTATION, STRIP_PIXELS, sample_range, shrink_to_rgb

RGB_BYTES = 4                    # Pillow keeps RGB in 4 bytes a pixel
BAND_PIXELS = STRIP_PIXELS // 8  # source pixels decoded at once (a float32 band: 512 KB); larger
                                 # bands cost more in temporaries than they save in calls
MAX_BAND_BYTES = 16 * 2**20     # a TIFF whose whole strips make larger bands is not banded
BANDED_FORMATS = ("PNG", "TIFF")

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}         # colour type -> samples a pixel
_PNG_PLAIN = {1: (0, "L"), 2: (4, "LA"), 3: (2, "RGB"), 4: (6, "RGBA")}  # bytes a pixel -> 8-bit type
_INFLATE_PIECE = 1 << 20                                 # bytes inflated at once
_FEED_BYTES = 1 << 16                                    # compressed bytes fed to zlib at once

# Tags that say how to decode a TIFF's pixels (the rest describe it); orientation is applied after.
_TIFF_DECODE_TAGS = (256, 258, 259, 262, 266, 277, 278, 284, 317, 320, 322, 323, 338, 339, 347,
                     530, 531, 532)
_STRIP_OFFSETS, _STRIP_COUNTS, _TILE_OFFSETS, _TILE_COUNTS = 273, 279, 324, 325
_DEPTH_NAMES = {"F": "32-bit float", "I": "32-bit integer", "I;16": "16-bit", "I;16B": "16-bit",
                "I;16L": "16-bit", "I;16N": "16-bit", "LA": "grey + alpha", "RGBA": "RGBA",
                "CMYK": "CMYK", "RGB": "RGB", "L": "greyscale", "P": "palette", "1": "bilevel"}


# What Pillow's decoders raise on damaged files (several plugins surface parsing slips as
# struct.error, IndexError or KeyError rather than OSError).
DECODE_ERRORS = (OSError, SyntaxError, EOFError, ValueError, struct.error, IndexError, KeyError,
                 TypeError, ZeroDivisionError)


class TooLargeToDecode(ValueError):
    """Refused from the header: decoding the file would need more memory than the budget."""


def decode_budget() -> int:
    """Bytes a decode may hold beyond the file: an RGB image of LIMITS.max_decoded_pixels."""
    return RGB_BYTES * LIMITS.max_decoded_pixels


def pixel_bytes(mode: str) -> int:
    """Bytes a pixel of `mode` takes in Pillow's memory (every multi-band mode takes 4)."""
    return 1 if mode in ("1", "L", "P") else 2 if mode.startswith("I;16") else 4


def decoded_bytes(image: Image.Image) -> int:
    """Bytes Pillow would allocate to decode the (opened, not loaded) image whole."""
    return image.width * image.height * pixel_bytes(image.mode)


def decode_in_bands(image: Image.Image, data: bytes, factor: int) -> Image.Image | None:
    """The opened PNG or TIFF `image` (the bytes `data`) as 8-bit RGB shrunk by `factor`, decoded a
    band at a time; None where decoding it whole, as Pillow does, stays within the budget.

    Raises TooLargeToDecode (a ValueError), from the header alone, for a file that cannot be
    banded and would need more than `decode_budget()` bytes; decoding errors (DECODE_ERRORS)
    surface where decoding whole would need more too, and otherwise leave it to Pillow whole."""
    if image.format not in BANDED_FORMATS:
        return None
    converts = image.mode != "RGB" or "transparency" in image.info
    whole = decoded_bytes(image) + (RGB_BYTES * image.width * image.height if converts else 0)
    if factor == 1 and whole <= decode_budget():
        return None
    bands, size, orientation = bands_of(image, data, factor)
    if bands is None:
        if decoded_bytes(image) > decode_budget():
            raise TooLargeToDecode(_refusal(image))
        return None  # within the budget decoded whole; only its conversion is banded
    try:
        levels = None
        if image.mode in ("I", "F"):  # their levels are the whole image's: a first pass reads them
            ranges = [sample_range(band) for _, band in bands()]
            levels = min(low for low, _ in ranges), max(high for _, high in ranges)
        return shrink_to_rgb(bands(), size, factor, levels, orientation)
    except DECODE_ERRORS:  # damaged, or a layout the bands get wrong: where it is affordable,
        if decoded_bytes(image) > decode_budget():  # Pillow's own decoder has the last word
            raise
        return None


def bands_of(image: Image.Image, data: bytes, factor: int = 1):
    """(bands, stored size, EXIF orientation) of an opened PNG or TIFF; `bands()` yields (top,
    image in the file's mode) for bands of whole multiples of `factor` rows (but the last), each
    call decoding them afresh. bands is None where the file cannot be banded."""
    return (_png_bands if image.format == "PNG" else _tiff_bands)(image, data, factor)


def _refusal(image: Image.Image) -> str:
    megapixels = image.width * image.height / 1e6
    kind = _DEPTH_NAMES.get(image.mode, image.mode)
    interlaced = image.format == "PNG" and image.info.get("interlace")
    animated = getattr(image, "n_frames", 1) > 1
    fits = decode_budget() / pixel_bytes(image.mode) / 1e6
    advice = ("without interlacing" if interlaced else "as a still PNG or a JPEG" if animated
              else "as an 8-bit PNG or JPEG")
    shape = "interlaced " if interlaced else "animated " if animated else ""
    return (
        f"This {megapixels:.3g}-megapixel {kind} {shape}{image.format} "
        f"would need {decoded_bytes(image) / 1e6:.3g} MB to decode, over the limit of "
        f"{decode_budget() / 1e6:.3g} MB: save it {advice}, or at most {fits:.3g} megapixels, "
        "and upload it again."
    )


# TIFF
# --------------------------------------------------------------------------------------------


def _tiff_bands(image, data: bytes, factor: int):
    """(bands, stored size, orientation), bands None where the layout cannot be banded."""
    tags = image.tag_v2
    width, height = tags.get(256), tags.get(257)
    tiled = _TILE_OFFSETS in tags
    offsets = tags.get(_TILE_OFFSETS if tiled else _STRIP_OFFSETS)
    counts = tags.get(_TILE_COUNTS if tiled else _STRIP_COUNTS)
    rows_per = tags.get(323) if tiled else min(tags.get(278, height), height)
    across = math.ceil(width / tags.get(322, width)) if tiled else 1
    planes = tags.get(277, 1) if tags.get(284, 1) == 2 else 1
    orientation = tags.get(ORIENTATION, 1)
    if not (isinstance(offsets, tuple) and isinstance(counts, tuple) and isinstance(rows_per, int)
            and rows_per > 0 and len(offsets) == len(counts) == planes * across
            * math.ceil(height / rows_per)):
        return None, None, None
    unit = math.lcm(rows_per, factor)  # whole strips, and whole multiples of the shrink factor
    band_rows = unit * max(1, BAND_PIXELS // (width * unit))
    if band_rows * width * pixel_bytes(image.mode) > MAX_BAND_BYTES:
        return None, None, None
    down = math.ceil(height / rows_per)

    def bands():
        for top in range(0, height, band_rows):
            rows = min(band_rows, height - top)
            first, last = top // rows_per, math.ceil((top + rows) / rows_per)
            picks = [plane * across * down + row * across + col for plane in range(planes)
                     for row in range(first, last) for col in range(across)]
            yield top, _tiff_band(image, data, [offsets[i] for i in picks], [counts[i] for i in picks],
                                  rows, tiled)

    return bands, (width, height), orientation


def _tiff_band(image, data: bytes, offsets, counts, rows: int, tiled: bool) -> Image.Image:
    """The band of `rows` rows made of these strips or tiles, decoded by Pillow as a TIFF of its own."""
    source = image.tag_v2
    ifd = TiffImagePlugin.ImageFileDirectory_v2(prefix=source.prefix)
    for tag in _TIFF_DECODE_TAGS:
        if tag in source:
            ifd.tagtype[tag] = TiffTags.LONG if source.tagtype[tag] == TiffTags.LONG8 else source.tagtype[tag]
            ifd[tag] = source[tag]
    ifd.tagtype[257] = TiffTags.LONG
    ifd[257] = rows
    pieces = []
    for offset, count in zip(offsets, counts):
        if offset + count > len(data):
            raise OSError("image file is truncated")
        pieces.append(data[offset:offset + count])
    starts = tuple(np.cumsum([0] + [len(p) for p in pieces[:-1]]).tolist())
    offsets_tag, counts_tag = (_TILE_OFFSETS, _TILE_COUNTS) if tiled else (_STRIP_OFFSETS, _STRIP_COUNTS)
    ifd.tagtype[offsets_tag] = ifd.tagtype[counts_tag] = TiffTags.LONG
    ifd[counts_tag] = tuple(counts)
    ifd[offsets_tag] = starts  # strip offsets: tobytes() adds where the IFD ends, tile offsets: we do
    endian = "<" if source.prefix == b"II" else ">"
    header = source.prefix + struct.pack(endian + "HL", 42, 8)  # a classic TIFF, its IFD at byte 8
    if tiled:
        ifd[offsets_tag] = tuple(8 + len(ifd.tobytes(8)) + start for start in starts)
    band = Image.open(io.BytesIO(header + ifd.tobytes(8) + b"".join(pieces)), formats=["TIFF"])
    band.load()
    if band.mode != image.mode or band.size != (source[256], rows):
        raise OSError(f"a band decoded as {band.mode} {band.size}, not {image.mode}")
    return band


# PNG
# --------------------------------------------------------------------------------------------


def _png_bands(image, data: bytes, factor: int):
    """(bands, size, orientation), bands None for an interlaced or animated PNG."""
    if image.info.get("interlace") or getattr(image, "n_frames", 1) > 1 or len(data) < 33:
        return None, None, None
    width, height, depth, colour_type = struct.unpack(">IIBB", data[16:26])
    channels = _PNG_CHANNELS.get(colour_type)
    if channels is None or depth not in (1, 2, 4, 8, 16):
        return None, None, None
    idats, exif = _png_chunks(data)
    if exif is not None and "exif" not in image.info:  # an eXIf after the pixels: Pillow reads it on load
        image.info["exif"] = b"Exif\x00\x00" + exif
    orientation = Image.Image.getexif(image).get(ORIENTATION, 1)  # the base class's: no load()
    bits = depth * channels
    row_bytes = (width * bits + 7) // 8
    step = max(1, bits // 8)  # PNG filters work on bytes this far apart
    rows = factor * max(1, BAND_PIXELS // (width * factor))

    def bands():
        previous = np.zeros(row_bytes, np.uint8)  # the row above the first is zeros
        pieces = _inflated(data, idats)
        buffered = b""  # inflated, not used yet: less than one piece
        for top in range(0, height, rows):
            count = min(rows, height - top)
            need = count * (row_bytes + 1)
            parts = [buffered]
            while sum(map(len, parts)) < need:
                piece = next(pieces, None)
                if piece is None:
                    raise OSError("image file is truncated")
                parts.append(piece)
            joined = b"".join(parts)
            filtered = np.frombuffer(joined, np.uint8, need).reshape(count, row_bytes + 1)
            buffered = joined[need:]
            raw = _unfilter(filtered, previous, step)
            previous = raw[-1]
            band = Image.frombytes(image.mode, (width, count), raw.tobytes(), "raw", image.tile[0].args)
            if image.palette is not None and image.mode == "P":
                palette_mode, palette = image.palette.getdata()
                band.putpalette(palette, palette_mode)
            if "transparency" in image.info:
                band.info["transparency"] = image.info["transparency"]
            yield top, band

    return bands, (width, height), orientation


def _png_chunks(data: bytes):
    """(offset, length) of each IDAT chunk's payload, and the eXIf payload (or None)."""
    idats, exif, pos = [], None, len(_PNG_SIGNATURE)
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idats.append((pos + 8, min(length, len(data) - pos - 8)))
        elif kind == b"eXIf":
            exif = data[pos + 8:pos + 8 + length]
        elif kind == b"IEND":
            break
        pos += 12 + length
    return idats, exif


def _inflated(data: bytes, idats):
    """The inflated IDAT stream, a bounded piece at a time (a zip bomb inflates only as far as read)."""
    inflater, view = zlib.decompressobj(), memoryview(data)
    try:
        for offset, length in idats:
            # fed a slice at a time: what is left over is copied each time, so keep it short
            for start in range(offset, offset + length, _FEED_BYTES):
                pending = view[start:min(start + _FEED_BYTES, offset + length)]
                while pending:
                    piece = inflater.decompress(pending, _INFLATE_PIECE)
                    pending = inflater.unconsumed_tail
                    if piece:
                        yield piece
        yield inflater.flush()
    except zlib.error as err:
        raise OSError(f"broken PNG data stream ({err})") from None


def _unfilter(filtered: np.ndarray, previous: np.ndarray, step: int) -> np.ndarray:
    """Raw row bytes (count, row_bytes) from PNG-filtered rows (count, 1 + row_bytes), decoded by
    Pillow as a plain 8-bit PNG of `step` bytes a pixel (in halves for 6 and 8), led by `previous`."""
    count, row_bytes = filtered.shape[0], filtered.shape[1] - 1
    if step not in _PNG_PLAIN:  # 6 or 8: two halves, each byte's neighbours stay in its half
        half = step // 2
        pixels = filtered[:, 1:].reshape(count, -1, step)
        above = previous.reshape(-1, step)
        parts = [_unfilter(np.concatenate([filtered[:, :1], pixels[:, :, s].reshape(count, -1)], 1),
                           np.ascontiguousarray(above[:, s]).reshape(-1), half)
                 for s in (slice(0, half), slice(half, step))]
        joined = [part.reshape(count, -1, half) for part in parts]
        return np.concatenate(joined, 2).reshape(count, row_bytes)
    colour_type, mode = _PNG_PLAIN[step]
    rows = np.empty((count + 1, row_bytes + 1), np.uint8)
    rows[0, 0], rows[0, 1:], rows[1:] = 0, previous, filtered  # filter 0: the row as it is
    header = struct.pack(">IIBBBBB", row_bytes // step, count + 1, 8, colour_type, 0, 0, 0)
    png = (_PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 0))
           + _chunk(b"IEND", b""))
    with Image.open(io.BytesIO(png), formats=["PNG"]) as plain:
        if plain.mode != mode:
            raise OSError(f"a band decoded as {plain.mode}, not {mode}")
        return np.asarray(plain).reshape(count + 1, row_bytes)[1:]


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
