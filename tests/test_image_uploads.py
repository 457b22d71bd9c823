"""open_image, colour conversion, banded decoding and the sample photos; every odd file is built in
memory."""

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from attnviz.base.limits import LIMITS
from attnviz.uploads.images import load_sample, open_image, sample_images

RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def quadrants() -> Image.Image:
    """32x24 RGB image with four flat colours, so lossless formats must round-trip exactly."""
    pixels = np.zeros((24, 32, 3), np.uint8)
    pixels[:12, :16] = RED
    pixels[:12, 16:] = GREEN
    pixels[12:, :16] = BLUE
    pixels[12:, 16:] = (200, 100, 50)
    return Image.fromarray(pixels)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height but holds no pixel data: a bomb that costs nothing."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b""))
        + chunk(b"IEND", b"")
    )


# Round trips
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt, options",
    [("PNG", {}), ("WEBP", {"lossless": True}), ("GIF", {}), ("BMP", {}), ("TIFF", {})],
)
def test_lossless_formats_round_trip_exactly(fmt, options):
    original = quadrants()
    opened = open_image(encode(original, fmt, **options))
    assert opened.mode == "RGB"
    assert np.array_equal(np.asarray(opened), np.asarray(original))


def test_jpeg_round_trip_is_close():
    original = quadrants()
    opened = open_image(encode(original, "JPEG", quality=95))
    assert opened.mode == "RGB" and opened.size == (32, 24)
    error = np.abs(np.asarray(opened, np.int16) - np.asarray(original, np.int16))
    assert np.median(error) <= 3  # block edges ring; flat areas stay within a few levels


def test_result_is_fully_loaded_and_independent_of_the_bytes():
    data = bytearray(encode(quadrants(), "PNG"))
    opened = open_image(data)
    data[:] = b"\0" * len(data)  # the caller may reuse its buffer
    assert opened.getpixel((0, 0)) == RED


# Colour modes
# --------------------------------------------------------------------------------------------


def test_cmyk_jpeg_becomes_rgb():
    cmyk_red = Image.new("CMYK", (16, 16), (0, 255, 255, 0))
    opened = open_image(encode(cmyk_red, "JPEG", quality=95))
    assert opened.mode == "RGB"
    assert np.allclose(opened.getpixel((8, 8)), RED, atol=6)


def test_16_bit_png_is_scaled_not_clipped():
    levels = np.array([[0, 257 * 128, 65535]], np.uint16)
    image = Image.fromarray(levels)
    assert image.mode == "I;16"
    opened = open_image(encode(image, "PNG"))
    assert [opened.getpixel((x, 0)) for x in range(3)] == [(0,) * 3, (128,) * 3, (255,) * 3]


def test_float_tiff_in_unit_range_is_scaled_to_255():
    image = Image.fromarray(np.array([[0.0, 0.25, 1.0]], np.float32))
    assert image.mode == "F"
    opened = open_image(encode(image, "TIFF"))
    assert [opened.getpixel((x, 0))[0] for x in range(3)] == [0, 64, 255]


def test_float_tiff_outside_every_range_is_stretched():
    image = Image.fromarray(np.array([[-2.0, 0.0, 2.0]], np.float32))
    opened = open_image(encode(image, "TIFF"))
    assert [opened.getpixel((x, 0))[0] for x in range(3)] == [0, 128, 255]


@pytest.mark.parametrize("fmt", ["PNG", "GIF"])
def test_palette_transparency_becomes_white(fmt):
    image = Image.new("P", (4, 1))
    image.putpalette([*RED, *GREEN] + [0] * (254 * 3))
    image.putdata([0, 1, 0, 1])
    opened = open_image(encode(image, fmt, transparency=0))
    assert [opened.getpixel((x, 0)) for x in range(4)] == [WHITE, GREEN, WHITE, GREEN]


def test_rgba_is_composited_on_white():
    pixels = np.array([[[0, 0, 0, 0], [255, 0, 0, 255], [0, 0, 0, 128]]], np.uint8)
    opened = open_image(encode(Image.fromarray(pixels, "RGBA"), "PNG"))
    assert opened.getpixel((0, 0)) == WHITE  # fully transparent black shows the white
    assert opened.getpixel((1, 0)) == RED
    assert all(abs(channel - 127) <= 1 for channel in opened.getpixel((2, 0)))


def test_grayscale_with_alpha_is_composited_on_white():
    pixels = np.array([[[0, 0], [50, 255]]], np.uint8)
    opened = open_image(encode(Image.fromarray(pixels, "LA"), "PNG"))
    assert [opened.getpixel((x, 0)) for x in range(2)] == [WHITE, (50, 50, 50)]


def test_lab_tiff_becomes_srgb():
    # L* = 50 %, a* = b* = 0 is the sRGB grey 119 (not 128: Lab is not RGB).
    opened = open_image(encode(Image.new("LAB", (4, 4), (128, 128, 128)), "TIFF"))
    assert all(abs(channel - 119) <= 1 for channel in opened.getpixel((1, 1)))


@pytest.mark.parametrize("mode, value, expected", [("L", 77, (77,) * 3), ("1", 0, (0,) * 3)])
def test_grayscale_and_bilevel_become_rgb(mode, value, expected):
    opened = open_image(encode(Image.new(mode, (8, 8), value), "PNG"))
    assert opened.mode == "RGB" and opened.getpixel((3, 3)) == expected


@pytest.mark.parametrize("fmt, options", [("GIF", {}), ("WEBP", {"lossless": True})])
def test_animation_gives_its_first_frame(fmt, options):
    frames = [Image.new("RGB", (8, 8), colour) for colour in (RED, GREEN, BLUE)]
    data = encode(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, **options)
    assert Image.open(io.BytesIO(data)).n_frames == 3
    assert open_image(data).getpixel((4, 4)) == RED


def test_exif_orientation_is_applied():
    # Stored 40 wide x 20 high, left half red; orientation 6 = "rotate 90° clockwise to view".
    stored = Image.new("RGB", (40, 20), BLUE)
    stored.paste(RED, (0, 0, 20, 20))
    exif = Image.Exif()
    exif[0x0112] = 6
    opened = open_image(encode(stored, "JPEG", quality=95, exif=exif))
    assert opened.size == (20, 40)
    assert np.allclose(opened.getpixel((10, 5)), RED, atol=8)  # left of stored → top of view
    assert np.allclose(opened.getpixel((10, 35)), BLUE, atol=8)


# Refusals
# --------------------------------------------------------------------------------------------


def test_empty_file_is_refused():
    with pytest.raises(ValueError, match="empty"):
        open_image(b"")


def test_random_bytes_are_not_an_image():
    noise = np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    with pytest.raises(ValueError, match="not an image"):
        open_image(noise)


def test_text_file_is_named_as_text():
    with pytest.raises(ValueError, match="not an image but a text file"):
        open_image("The animal didn't cross the street.\nÜber 動物\n".encode() * 20)


def test_truncated_png_is_named_truncated():
    rng = np.random.default_rng(1)
    data = encode(Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)), "PNG")
    with pytest.raises(ValueError, match="truncated"):
        open_image(data[: len(data) // 2])


def test_png_cut_inside_its_header_is_named_truncated_png():
    data = encode(quadrants(), "PNG")
    with pytest.raises(ValueError, match="starts like a PNG.*truncated"):
        open_image(data[:30])


def test_corrupt_pixel_data_is_refused():
    data = bytearray(encode(quadrants(), "PNG"))
    idat = data.index(b"IDAT")
    data[idat + 4 : idat + 12] = b"\xff" * 8  # break the zlib stream
    with pytest.raises(ValueError, match="corrupt|truncated"):
        open_image(bytes(data))


@pytest.mark.parametrize(
    "data, name",
    [
        (b"8BPS\x00\x01" + b"\x00" * 64, "Photoshop"),
        (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n", "EPS"),
        (b"%PDF-1.7\n" + b"\x00" * 64, "PDF"),
        (b'<svg xmlns="x" width="10" height="10"></svg>', "SVG"),
        (b"\x00\x00\x00\x1cftypheic" + b"\x00" * 64, "HEIC"),
    ],
)
def test_unsupported_formats_are_named(data, name):
    with pytest.raises(ValueError, match=f"{name}.*not supported"):
        open_image(data)


def test_real_format_outside_the_list_is_refused():
    ppm = encode(quadrants(), "PPM")  # Pillow reads PPM, but uploads of it are not accepted
    with pytest.raises(ValueError, match="not an image in a supported format"):
        open_image(ppm)


def test_decompression_bomb_is_refused_from_its_header():
    # 10^10 pixels: over Pillow's own hard limit, refused before a byte of pixels is read.
    with pytest.raises(ValueError, match="10,000,000,000 pixels .*over the limit of 40,000,000"):
        open_image(png_header_only(100_000, 100_000))


def test_image_between_pillows_warning_and_error_limits_is_refused():
    # 100 Mpx: Pillow only warns (pytest.warns records it even where warnings are errors).
    with pytest.warns(Image.DecompressionBombWarning):
        with pytest.raises(ValueError, match="10000×10000 = 100,000,000 pixels, over the limit"):
            open_image(png_header_only(10_000, 10_000))


def test_image_over_our_pixel_limit_is_refused_before_decoding():
    # 64 Mpx is under Pillow's limits; had it been decoded, the missing data would say "truncated".
    expected = "8000×8000 = 64,000,000 pixels, over the limit of 40,000,000"
    with pytest.raises(ValueError, match=expected):
        open_image(png_header_only(8000, 8000))


def test_pixel_limit_is_a_keyword():
    data = encode(quadrants(), "PNG")
    with pytest.raises(ValueError, match="32×24 = 768 pixels, over the limit of 700"):
        open_image(data, max_pixels=700)
    assert open_image(data, max_pixels=768).size == (32, 24)


def test_byte_limit():
    data = encode(quadrants(), "BMP")
    with pytest.raises(ValueError, match="over the limit"):
        open_image(data, max_bytes=len(data) - 1)
    assert open_image(data, max_bytes=len(data)).size == (32, 24)


def padded_png(size: int) -> bytes:
    """A valid PNG of exactly `size` bytes: Pillow stops reading at IEND, the rest is padding."""
    data = encode(quadrants(), "PNG")
    return data + b"\0" * (size - len(data))


def test_byte_limit_is_exact_at_the_upload_cap():
    # The cap is decimal, as the browser's upload widget counts it: 20 MB = 20,000,000 bytes.
    MAX_IMAGE_BYTES = LIMITS.max_upload_bytes
    assert MAX_IMAGE_BYTES == 20_000_000
    assert open_image(padded_png(MAX_IMAGE_BYTES)).size == (32, 24)
    with pytest.raises(ValueError, match=r"20,000,001 bytes, over the limit of 20,000,000 bytes "
                                         r"\(20 MB\)"):
        open_image(padded_png(MAX_IMAGE_BYTES + 1))


def test_streamlit_upload_cap_agrees_with_the_library():
    """Every file the upload widget lets through is either read or refused with our message.

    Streamlit 1.67's widget refuses files over maxUploadSize x 10^6 bytes (x 2^20 on Windows) and
    its server refuses request bodies over maxUploadSize x 2^20 bytes (see .streamlit/config.toml).
    Our cap must be the smallest of these, with room for the multipart framing around the file."""
    import tomllib
    from pathlib import Path

    import streamlit

    from attnviz.base.limits import Limits

    config = Path(__file__).resolve().parent.parent / ".streamlit" / "config.toml"
    megabytes = tomllib.loads(config.read_text())["server"]["maxUploadSize"]
    cap = Limits().max_upload_bytes
    assert cap == megabytes * 10**6                      # = the widget's cap outside Windows
    assert cap + 64 * 1024 <= megabytes * 2**20          # under the server's cap, framing included
    # The widget's unit switch (1024 on Windows, else 1000): if a Streamlit upgrade changes it,
    # re-read how the widget compares sizes and update config.toml, LIMITS and this test.
    static = Path(streamlit.__file__).parent / "static"
    assert any("?1024:1e3" in js.read_text(errors="ignore") for js in static.rglob("utils.*.js"))


@pytest.mark.parametrize("width, height", [(1, 640), (640, 1), (30, 601), (601, 30)])
def test_strips_beyond_the_aspect_limit_are_refused_before_decoding(width, height):
    data = png_header_only(width, height)        # no pixel data: decoding would say "truncated"
    longer = "tall" if height > width else "wide"
    with pytest.raises(ValueError, match=f"{width}×{height} px, .* times as {longer} .* limit is 20:1"):
        open_image(data)


def test_the_75_byte_strip_from_the_issue_is_refused():
    data = encode(Image.new("RGB", (1, 640), RED), "PNG")
    assert len(data) < 100
    with pytest.raises(ValueError, match="640.0 times as tall as it is wide"):
        open_image(data)


def test_aspect_limit_is_inclusive_and_a_keyword():
    assert open_image(encode(Image.new("RGB", (2, 40)), "PNG")).size == (2, 40)   # exactly 20:1
    assert open_image(encode(Image.new("RGB", (40, 2)), "PNG")).size == (40, 2)
    with pytest.raises(ValueError, match="limit is 20:1"):
        open_image(encode(Image.new("RGB", (2, 41)), "PNG"))
    with pytest.raises(ValueError, match="limit is 4:1"):
        open_image(encode(Image.new("RGB", (10, 50)), "PNG"), max_aspect=4)


def test_non_bytes_input_is_a_type_error():
    with pytest.raises(TypeError, match="bytes"):
        open_image("picture.png")


# Sample photos
# --------------------------------------------------------------------------------------------


def test_sample_images_are_found():
    samples = sample_images()
    assert set(samples) == {"cat", "coffee", "astronaut", "rocket", "motorcycle"}
    assert all(path.is_file() for path in samples.values())


def test_load_sample_gives_an_rgb_photo():
    cat = load_sample("cat")
    assert cat.mode == "RGB" and cat.size == (451, 300)
    assert np.asarray(cat).std() > 20  # a photo, not a flat image


def test_unknown_sample_is_refused():
    with pytest.raises(ValueError, match="cat"):
        load_sample("dog")


# Failures remembered, decodes bounded, large images shrunk before converting
# --------------------------------------------------------------------------------------------
from attnviz.uploads import colour, images  # noqa: E402


def corrupt_png(seed: int = 0) -> bytes:
    data = bytearray(encode(Image.new("RGB", (32, 24 + seed)), "PNG"))
    idat = data.index(b"IDAT")
    data[idat + 4 : idat + 12] = b"\xff" * 8  # break the zlib stream
    return bytes(data)


def test_a_file_that_failed_is_not_decoded_again(monkeypatch):
    """A 20 MB RLE8 BMP spent 8 s in Pillow's decoder on every rerun: the same bytes now re-raise
    the same message at once; memory is bounded (the oldest failure is forgotten first)."""
    opened = []
    real_open = images.Image.open
    monkeypatch.setattr(images.Image, "open", lambda *a, **kw: opened.append(1) or real_open(*a, **kw))
    bad = corrupt_png()
    messages = []
    for _ in range(3):
        with pytest.raises(ValueError, match="corrupt|truncated") as err:
            open_image(bad)
        messages.append(str(err.value))
    assert len(opened) == 1 and len(set(messages)) == 1
    with pytest.raises(ValueError, match="over the limit of 700"):  # other bounds: decoded again
        open_image(bad, max_pixels=700)
    assert len(opened) == 2
    for seed in range(1, images.REMEMBERED_FAILURES + 1):  # as many other failures: the first goes
        with pytest.raises(ValueError):
            open_image(corrupt_png(seed))
    opened.clear()
    with pytest.raises(ValueError, match="corrupt|truncated"):
        open_image(bad)
    assert len(opened) == 1


def test_decodes_are_bounded_and_busy_is_not_a_failure(set_limits):
    set_limits(max_image_decodes=1)
    data = encode(quadrants(), "PNG")
    with images.decode_slot():
        with pytest.raises(ValueError, match="The server is busy") as err:
            open_image(data)
        assert isinstance(err.value, images.DecodersBusy)
    assert open_image(data).size == (32, 24)  # not remembered as a failure


def image_bytes(kind: str, size=(64, 48)) -> tuple[bytes, Image.Image]:
    """(file, what open_image gives at full size) for each high-bit-depth or odd mode."""
    w, h = size
    ramp = np.add.outer(np.arange(h), np.arange(w)).astype(np.float64) / (w + h)  # (h, w) in [0, 1)
    if kind == "F":
        image, fmt = Image.fromarray(ramp.astype(np.float32) * 4 - 1), "TIFF"   # stretched min..max
    elif kind == "I":
        image, fmt = Image.fromarray((ramp * 3e6).astype(np.int32)), "TIFF"
    elif kind == "I;16":
        image, fmt = Image.fromarray((ramp * 65535).astype(np.uint16)), "PNG"
    elif kind == "LA":
        image, fmt = Image.fromarray(np.stack([(ramp * 255).astype(np.uint8),
                                               (255 - ramp * 255).astype(np.uint8)], -1)), "PNG"
    elif kind == "P":
        image, fmt = Image.fromarray((ramp * 255).astype(np.uint8)).convert("P"), "GIF"
    else:
        image, fmt = Image.fromarray(np.stack([(ramp * 255).astype(np.uint8)] * 3, -1)), kind
    data = encode(image, fmt, **({"transparency": 0} if kind == "P" else {}))
    with set_max_decoded(10**9):
        full = open_image(data)
    return data, full


class set_max_decoded:
    def __init__(self, n):
        from attnviz.base import limits
        self.cm = limits.override(max_decoded_pixels=n)

    def __enter__(self):
        return self.cm.__enter__()

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc)


@pytest.mark.parametrize("kind", ["F", "I", "I;16", "LA", "P", "PNG", "JPEG"])
def test_a_large_image_is_shrunk_by_a_whole_factor_while_it_is_decoded(kind):
    """A 40 Mpx float32 TIFF peaked at 2.0 GB becoming RGB: now it is shrunk first (to at most
    LIMITS.max_decoded_pixels), and its levels and colours are those of the full-size result."""
    data, full = image_bytes(kind)
    with set_max_decoded(64 * 48 // 4):       # factor 2
        small = open_image(data)
    assert small.mode == "RGB" and small.size == (32, 24)
    expected = np.asarray(full.reduce(2), np.int16)
    # JPEG: decoded at half scale by libjpeg; LA: averaged premultiplied in 8 bits, then composited
    tolerance = {"JPEG": 6, "LA": 2}.get(kind, 1)
    assert np.abs(np.asarray(small, np.int16) - expected).max() <= tolerance, kind
    with set_max_decoded(64 * 48 // 4 - 1):   # one pixel less: factor 3 (JPEG: libjpeg's 1/2, then 1/2)
        assert open_image(data).size == ((16, 12) if kind == "JPEG" else (22, 16))


def test_a_shrunk_photo_keeps_its_orientation():
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    data = encode(Image.new("RGB", (40, 20), RED), "JPEG", quality=95, exif=exif)
    with set_max_decoded(200):
        assert open_image(data).size == (10, 20)


def test_high_bit_depth_conversion_makes_no_full_size_float_copies():
    """The float64 copies of the whole image went: numpy's peak is a few strips, whatever the size."""
    import tracemalloc
    w, h = 4000, 3000  # 12 Mpx, under the shrink cap: converted at full size
    steps = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5) * 1000  # outside every range: stretched
    blocks = np.kron(steps, np.ones((1000, 1000), np.float32))
    data = encode(Image.fromarray(blocks), "TIFF", compression="tiff_deflate")
    tracemalloc.start()
    try:
        opened = open_image(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert opened.size == (w, h) and opened.getpixel((3999, 2999))[0] == 255
    assert peak < 48 * colour.STRIP_PIXELS, f"{peak / 2**20:.0f} MB"  # before: ~580 MB


def test_peak_memory_of_a_40_mpx_float_tiff(tmp_path):
    """Peak RSS of decoding a 40 Mpx float32 TIFF in a fresh process: 1.7 GB before; under 6 bytes
    a source pixel once converted in strips (the tighter bound of decoding in bands, and the
    other files of the issue: test_peak_memory_of_a_40_mpx_upload_is_bounded_by_the_capped_size)."""
    import subprocess
    import sys
    blocks = np.random.default_rng(0).random((10, 16)).astype(np.float32)
    path = tmp_path / "big.tif"
    Image.fromarray(np.kron(blocks, np.ones((500, 500), np.float32))).save(path, compression="tiff_deflate")
    code = (  # VmHWM: this process's own peak (ru_maxrss would carry the parent's over exec)
        "import sys\n"
        "from attnviz.uploads.images import open_image\n"
        "def hwm():\n"
        "    line = next(x for x in open('/proc/self/status') if x.startswith('VmHWM'))\n"
        "    return int(line.split()[1]) * 1024\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "base = hwm()\n"
        "image = open_image(data)\n"
        "print(image.size, hwm() - base)\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    size, extra = out.stdout.rsplit(" ", 1)
    assert size == "(4000, 2500)"
    assert int(extra) < 6 * 40_000_000, f"{int(extra) / 2**20:.0f} MB"


# Decoded a band at a time: PNG and TIFF never exist whole
# --------------------------------------------------------------------------------------------
import tifffile  # noqa: E402  (scikit-image's dependency: the TIFF layouts Pillow does not write)

from attnviz.uploads import bands  # noqa: E402


def noise(shape, dtype=np.uint8, seed=0) -> np.ndarray:
    """Random samples: Pillow's encoder then picks every PNG row filter, Paeth and Average too."""
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.floating):
        return (rng.random(shape) * 7 - 3).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -(2**30)), min(info.max, 2**30), shape, endpoint=True).astype(dtype)


def png_filtered(raw: np.ndarray, width: int, depth: int, colour_type: int, step: int) -> bytes:
    """A PNG of raw row bytes (height, row_bytes), row y filtered with filter y % 5 (all five)."""
    height = raw.shape[0]
    rows, above = [], np.zeros(raw.shape[1], np.int32)
    for y in range(height):
        x = raw[y].astype(np.int32)
        left = np.concatenate([np.zeros(step, np.int32), x[:-step]])
        corner = np.concatenate([np.zeros(step, np.int32), above[:-step]])
        p = left + above - corner
        pa, pb, pc = np.abs(p - left), np.abs(p - above), np.abs(p - corner)
        paeth = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, above, corner))
        guess = [0, left, above, (left + above) // 2, paeth][y % 5]
        rows.append(bytes([y % 5]) + ((x - guess) % 256).astype(np.uint8).tobytes())
        above = x

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"".join(rows)))
            + chunk(b"IEND", b""))


def png_cases():
    h, w = 29, 37  # odd, so sub-byte rows end part-way through a byte
    yield "1", encode(Image.fromarray(noise((h, w)) > 127), "PNG")
    yield "L", encode(Image.fromarray(noise((h, w))), "PNG")
    yield "LA", encode(Image.fromarray(noise((h, w, 2)), "LA"), "PNG")
    yield "RGB", encode(Image.fromarray(noise((h, w, 3))), "PNG")
    yield "RGBA", encode(Image.fromarray(noise((h, w, 4))), "PNG")
    yield "RGB+tRNS", encode(Image.fromarray(noise((h, w, 3)) // 64 * 64), "PNG", transparency=(64, 0, 128))
    yield "I;16", encode(Image.fromarray(noise((h, w), np.uint16)), "PNG")
    yield "P;4", encode(Image.fromarray(noise((h, w)) // 16).convert("P", palette=Image.Palette.ADAPTIVE,
                                                                    colors=16), "PNG", bits=4)
    yield "P+tRNS", encode(Image.fromarray(noise((h, w)) // 32).convert("P"), "PNG", transparency=3)
    # every filter, on the depths Pillow does not write: 2-bit grey, 16-bit grey+alpha, RGB, RGBA
    yield "L;2", png_filtered(noise((h, (w * 2 + 7) // 8)), w, 2, 0, 1)
    yield "LA;16", png_filtered(noise((h, w * 4)), w, 16, 4, 4)
    yield "RGB;16", png_filtered(noise((h, w * 6)), w, 16, 2, 6)
    yield "RGBA;16", png_filtered(noise((h, w * 8)), w, 16, 6, 8)
    yield "RGB;8 all filters", png_filtered(noise((h, w * 3)), w, 8, 2, 3)


def tiff_cases():
    h, w = 29, 37
    for mode, pixels in [("F", noise((h, w), np.float32)), ("I", noise((h, w), np.int32)),
                         ("I;16", noise((h, w), np.uint16)), ("L", noise((h, w))),
                         ("RGB", noise((h, w, 3))), ("RGBA", noise((h, w, 4)))]:
        image = Image.fromarray(pixels)
        yield f"{mode} raw", tiff_bytes(pixels, rowsperstrip=3)  # Pillow writes these in one strip
        stride = pixels.itemsize * pixels.size // h  # bytes a row
        for compression in ("tiff_deflate", "tiff_lzw", "packbits"):
            # strips of 3 rows: bands of whole strips and whole shrink factors (6 rows at factor 2)
            yield f"{mode} {compression}", encode(image, "TIFF", compression=compression,
                                                  strip_size=3 * stride)
    yield "CMYK", encode(Image.fromarray(noise((h, w, 4)), "CMYK"), "TIFF", compression="tiff_deflate",
                         strip_size=4 * w * 4)
    yield "1", encode(Image.fromarray(noise((h, w)) > 127), "TIFF", compression="tiff_deflate",
                      strip_size=3 * ((w + 7) // 8))
    yield "P", encode(Image.fromarray(noise((h, w)) // 32).convert("P"), "TIFF", compression="tiff_lzw",
                      strip_size=3 * w)
    yield "JPEG", encode(Image.fromarray(noise((h, w, 3))), "TIFF", compression="jpeg", strip_size=8 * w * 3)
    yield "big-endian", tiff_bytes(noise((h, w), np.float32), byteorder=">", rowsperstrip=4)
    yield "big-endian 16-bit", tiff_bytes(noise((h, w), np.uint16), byteorder=">", rowsperstrip=3,
                                          compression="zlib")
    yield "tiled", tiff_bytes(noise((h, w, 3)), tile=(16, 16), compression="zlib")
    yield "planar", tiff_bytes(noise((3, h, w)), planarconfig="separate", photometric="rgb", rowsperstrip=5)
    yield "predictor", tiff_bytes(noise((h, w), np.uint16), predictor=True, compression="zlib",
                                  rowsperstrip=2)
    yield "odd strips", tiff_bytes(noise((h, w), np.float32), compression="zlib", rowsperstrip=7)


def tiff_bytes(pixels: np.ndarray, **options) -> bytes:
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, pixels, **options)
    return buffer.getvalue()


def stacked(data: bytes, factor: int = 1):
    """The bands' pixels one under the other, and the bands' count."""
    with Image.open(io.BytesIO(data)) as image:
        read, size, _ = bands.bands_of(image, data, factor)
        assert read is not None
        parts = list(read())
    assert [top for top, _ in parts] == sorted({top for top, _ in parts}) and parts[0][0] == 0
    assert all(top % factor == 0 for top, _ in parts)
    return np.concatenate([np.asarray(band) for _, band in parts]), parts


@pytest.mark.parametrize("name, data", list(png_cases()) + list(tiff_cases()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_bands_decode_exactly_what_pillow_decodes_whole(name, data, monkeypatch):
    monkeypatch.setattr(bands, "BAND_PIXELS", 37 * 4)  # bands of a few rows: many per image
    whole = Image.open(io.BytesIO(data))
    whole.load()
    pixels, parts = stacked(data, factor=2)
    assert len(parts) >= 2, name
    assert all(band.mode == whole.mode for _, band in parts)
    expected = np.asarray(whole)  # (concatenate gives big-endian samples in native order)
    assert pixels.dtype.kind == expected.dtype.kind and pixels.itemsize == expected.itemsize, name
    assert np.array_equal(pixels, expected), name
    if whole.mode == "P":
        assert all(band.getpalette() == whole.getpalette() for _, band in parts)
    if "transparency" in whole.info:
        assert all(band.info["transparency"] == whole.info["transparency"] for _, band in parts)
    with set_max_decoded(10**9):
        full = open_image(data)
    with set_max_decoded(10**9), monkeypatch.context() as m:  # banded at full size: the same RGB
        m.setattr(bands, "decode_budget", lambda: 0)
        assert np.array_equal(np.asarray(open_image(data)), np.asarray(full)), name


@pytest.mark.parametrize("orientation", range(1, 9))
def test_bands_are_oriented_as_the_whole(orientation, monkeypatch):
    monkeypatch.setattr(colour, "STRIP_PIXELS", 40)
    image = Image.fromarray(noise((23, 10, 3)))
    whole = image.reduce(2)
    method = colour.TRANSPOSE.get(orientation)
    expected = whole if method is None else whole.transpose(method)
    got = colour.shrink_to_rgb(colour.strips(image, 2), image.size, 2, orientation=orientation)
    assert np.array_equal(np.asarray(got), np.asarray(expected))


def test_an_oriented_tiff_is_banded_and_turned():
    pixels = noise((30, 20), np.float32)
    data = tiff_bytes(pixels, rowsperstrip=2, extratags=[(274, "H", 1, 6, True)])  # 90° clockwise
    with set_max_decoded(10**9):
        whole = open_image(data)
    with set_max_decoded(150):  # factor 2
        small = open_image(data)
    assert whole.size == (30, 20) and small.size == (15, 10)
    assert np.abs(np.asarray(small, np.int16) - np.asarray(whole.reduce(2), np.int16)).max() <= 1


def test_a_png_exif_after_its_pixels_still_orients_it():
    exif = Image.Exif()
    exif[0x0112] = 6
    body = exif.tobytes()[6:]  # without "Exif\0\0"
    data = encode(Image.fromarray(noise((20, 40, 3))), "PNG")
    end = data.rindex(b"IEND") - 4
    chunk = struct.pack(">I", len(body)) + b"eXIf" + body + struct.pack(">I", zlib.crc32(b"eXIf" + body))
    data = data[:end] + chunk + data[end:]
    with set_max_decoded(10**9):
        assert open_image(data).size == (20, 40)
    with set_max_decoded(200):  # factor 2
        assert open_image(data).size == (10, 20)


@pytest.mark.parametrize("cut", ["stream", "chunk"])
def test_a_truncated_banded_png_is_named_truncated(cut):
    data = encode(Image.fromarray(noise((64, 48), np.uint16)), "PNG")
    idat = data.index(b"IDAT")
    (length,) = struct.unpack(">I", data[idat - 4:idat])
    if cut == "stream":  # the chunk says it is shorter: the stream stops early
        head = data[:idat - 4] + struct.pack(">I", length // 2)
        data = head + data[idat:idat + 4 + length // 2] + data[-12:]
    else:
        data = data[:idat + 4 + length // 2]
    with set_max_decoded(64 * 48 // 4), pytest.raises(ValueError, match="truncated|corrupt"):
        open_image(data)


def test_a_corrupt_banded_tiff_is_refused_with_a_message():
    data = bytearray(encode(Image.fromarray(noise((48, 64), np.float32)), "TIFF", compression="tiff_deflate",
                            strip_size=4 * 64 * 4))
    third = Image.open(io.BytesIO(bytes(data))).tag_v2[273][2]
    data[third:third + 8] = b"\xff" * 8  # the third strip's deflate header
    with set_max_decoded(64 * 48 // 4), pytest.raises(ValueError, match="corrupt|truncated"):
        open_image(bytes(data))


def test_bands_that_fail_leave_an_affordable_file_to_pillow(monkeypatch):
    """Where decoding whole fits the budget, Pillow's own decoder has the last word; past it, the
    bands' error is the answer."""
    data = encode(Image.fromarray(noise((48, 64))), "PNG")  # greyscale: 3,072 bytes decoded

    def broken(*args, **kwargs):
        raise OSError("a layout the bands get wrong")

    monkeypatch.setattr(bands, "shrink_to_rgb", broken)
    with set_max_decoded(64 * 48 // 4):  # factor 2, a budget of 3,072 bytes: decoded whole
        assert open_image(data).size == (32, 24)
    with set_max_decoded(64 * 48 // 4 - 1), pytest.raises(ValueError, match=r"corrupt or unreadable "
                                                                             r"\(a layout the bands"):
        open_image(data)


def interlaced_png_header(width: int, height: int, depth: int, colour_type: int) -> bytes:
    data = bytearray(png_header_only(width, height))
    data[24:29] = bytes([depth, colour_type, 0, 0, 1])  # depth, colour type, ..., interlace = Adam7
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def test_what_cannot_be_banded_is_refused_from_the_header_over_the_budget():
    """An interlaced PNG needs all its rows at once; over 4 bytes x max_decoded_pixels it is refused,
    saying what to do, before a byte of it is decoded."""
    with pytest.raises(bands.TooLargeToDecode) as err:
        open_image(interlaced_png_header(8000, 5000, 16, 0))  # 40 Mpx, 16-bit grey: 80 MB
    assert str(err.value) == (
        "This 40-megapixel 16-bit interlaced PNG would need 80 MB to decode, over the limit of 64 MB: "
        "save it without interlacing, or at most 32 megapixels, and upload it again.")
    one_strip = tiff_bytes(np.zeros((5000, 8000), np.float32), compression="zlib", rowsperstrip=5000)
    with pytest.raises(ValueError, match=r"This 40-megapixel 32-bit float TIFF would need 160 MB to decode, "
                                         r"over the limit of 64 MB: save it as an 8-bit PNG or JPEG, or at "
                                         r"most 16 megapixels"):
        open_image(one_strip)
    frames = [Image.new("RGB", (30, 20), colour) for colour in (RED, GREEN)]
    animated = encode(frames[0], "PNG", save_all=True, append_images=frames[1:])
    with set_max_decoded(100), pytest.raises(ValueError, match="RGB animated PNG would need 0.0024 MB.*"
                                                            "save it as a still PNG or a JPEG"):
        open_image(animated)
    with set_max_decoded(600):  # its 2,400 bytes fit: decoded whole, as before
        assert open_image(animated).getpixel((0, 0)) == RED


def test_8_bit_images_within_the_budget_open_as_before():
    """A 40 Mpx 8-bit grey TIFF in one strip cannot be banded, but its 40 MB fit: decoded whole."""
    pixels = np.kron(noise((10, 16)), np.ones((500, 500), np.uint8))
    one_strip = tiff_bytes(pixels, compression="zlib", rowsperstrip=5000)
    opened = open_image(one_strip)
    assert opened.size == (4000, 2500)
    assert np.array_equal(np.asarray(opened)[::250, ::250, 0], pixels[::500, ::500])


def issue_file(kind: str, path) -> tuple[int, int]:
    """The hostile files: 40 Mpx (8000 x 5000), compressed to well under a megabyte; and two
    8-bit ones that must stay as lean: a 40 Mpx JPEG and a 16 Mpx RGB PNG (not shrunk at all).
    Returns the size open_image gives."""
    blocks = np.random.default_rng(0).random((10, 16))
    big = lambda a: np.kron(a, np.ones((500, 500), a.dtype))  # noqa: E731
    if kind in ("JPEG", "16 Mpx RGB PNG"):
        rgb = np.stack([big((blocks * 255).astype(np.uint8))] * 3, -1)
        if kind == "JPEG":
            Image.fromarray(rgb).save(path, "JPEG", quality=90)
            return 4000, 2500
        Image.fromarray(np.ascontiguousarray(rgb[:4000, :4000])).save(path, "PNG")
        return 4000, 4000
    if kind == "float32 TIFF":
        Image.fromarray(big(blocks.astype(np.float32))).save(path, "TIFF", compression="tiff_deflate")
    elif kind == "int32 TIFF":
        Image.fromarray(big((blocks * 3e6).astype(np.int32))).save(path, "TIFF", compression="tiff_deflate")
    elif kind == "16-bit PNG":
        Image.fromarray(big((blocks * 65535).astype(np.uint16))).save(path, "PNG")
    else:
        grey, alpha = big((blocks * 255).astype(np.uint8)), big((255 - blocks * 200).astype(np.uint8))
        Image.fromarray(np.stack([grey, alpha], -1), "LA").save(path, "PNG")
    return 4000, 2500


PEAK_SLACK = 16 * 2**20  # beyond the RGB result: one band's work, and the allocator's rounding


@pytest.mark.parametrize("kind", ["float32 TIFF", "int32 TIFF", "16-bit PNG", "LA PNG", "JPEG",
                                  "16 Mpx RGB PNG"])
def test_peak_memory_of_a_40_mpx_upload_is_bounded_by_the_capped_size(kind, tmp_path):
    """Peak RSS of decoding each 40 Mpx file of the issue, in a fresh process: 2.0 / 2.0 / 1.16 /
    1.23 GB at first, 211 / 212 / 144 / 210 MB once converted in strips; now, decoded in bands, at
    most 4 bytes a pixel of LIMITS.max_decoded_pixels (an RGB image that size) plus PEAK_SLACK. The
    JPEG (decoded at half scale) and the 16 Mpx PNG (decoded whole: 128 MB while an upright image
    was still copied) stay under it too."""
    import subprocess
    import sys
    path = tmp_path / "big"
    expected = issue_file(kind, path)
    code = (  # VmHWM: this process's own peak (ru_maxrss would carry the parent's over exec)
        "import io, sys\n"
        "from PIL import Image\n"
        "from attnviz.base import limits\n"
        "from attnviz.uploads.images import open_image\n"
        "def hwm():\n"
        "    line = next(x for x in open('/proc/self/status') if x.startswith('VmHWM'))\n"
        "    return int(line.split()[1]) * 1024\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "probe, small = Image.open(sys.argv[1]), io.BytesIO()  # the header only\n"
        "options = {'compression': probe.info['compression']} if probe.format == 'TIFF' else {}\n"
        "Image.new(probe.mode, (64, 48)).save(small, probe.format, **options)\n"
        "with limits.override(max_decoded_pixels=700):  # Pillow's plugins and numpy's paths, loaded\n"
        "    open_image(small.getvalue())\n"
        "base = hwm()\n"
        "image = open_image(data)\n"
        "print(image.size, image.mode, hwm() - base, limits.LIMITS.max_decoded_pixels)\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    size, mode, extra, capped = out.stdout.rsplit(" ", 3)
    assert size == str(expected) and mode == "RGB"
    assert int(extra) <= 4 * int(capped) + PEAK_SLACK, f"{kind}: {int(extra) / 1e6:.0f} MB"


@pytest.mark.parametrize("fmt, options, says", [
    ("WEBP", {}, r"WebP would need about .* MB to decode .* save it as a JPEG or PNG, or as a WebP of at most "),
    ("JPEG", {"progressive": True}, r"progressive JPEG would need .* save it as a baseline \(not progressive\) "
                                    r"JPEG or a PNG, or of at most ")])
def test_a_file_decoded_whole_larger_than_the_decode_cap_is_refused_from_its_header(
        set_limits, fmt, options, says):
    """Pillow decodes WebP and progressive JPEG whole at full size: one we would have to shrink
    is refused before decoding, with what to do; one within the cap still opens; a baseline JPEG
    over the cap is decoded at a reduced scale, as before."""
    set_limits(max_decoded_pixels=64 * 40)

    def encoded(size, fmt=fmt, **kw):
        buffer = io.BytesIO()
        Image.new("RGB", size, (200, 30, 30)).save(buffer, format=fmt, **kw)
        return buffer.getvalue()

    with pytest.raises(ValueError, match=says + r"0.00256 megapixels, and upload it again"):
        open_image(encoded((65, 40), **options))
    assert open_image(encoded((64, 40), **options)).size == (64, 40)
    width, height = open_image(encoded((130, 80), "JPEG")).size     # shrunk by a whole factor
    assert width * height <= 64 * 40 and (width, height) in ((65, 40), (44, 27), (33, 20))
