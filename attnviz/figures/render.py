"""Static renderers: colour-mapped RGB images, patch-map overlays and PNG/SVG exports.

Everything returns arrays, PIL images or bytes; `viz.py` wraps them in plotly figures and re-exports
them. Images are built in numpy because one colour-mapped image of all heads paints ~10x faster in
the browser than one plotly heatmap per head (144 heads in a real browser: 0.2-0.75 s against
3-9 s for 144 heatmaps).
Matplotlib is used for colormaps and through its object API only (no pyplot), so concurrent
Streamlit sessions never share a "current figure".
"""

from __future__ import annotations

import functools
import io
import logging
import os
import threading
import unicodedata
import warnings

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from PIL import Image, ImageDraw, ImageFont

from attnviz.analysis.stats import downsample_attention
from attnviz.base.limits import LIMITS
from attnviz.core.tokens import WHITESPACE_SYMBOLS

logger = logging.getLogger(__name__)

OVERVIEW_BACKGROUND = (255, 255, 255)   # gaps between cells; white reads as "not data"
OFF_HEAD_FADE = 0.75                    # how far a switched-off head is blended into the background
MAX_LABEL_CHARS = 24                    # longer tokens are cut with "…" so axes stay readable
# Zero-width and direction-control characters are invisible; show them as <U+XXXX> so a token
# made only of them still has a visible, distinct label.
_INVISIBLE_CATEGORIES = {"Cf", "Cc", "Zl", "Zp"}


# --- Labels ------------------------------------------------------------------------------------
def visible_token(token: str) -> str:
    """A label that is never blank: tokens made only of whitespace or invisible characters get
    visible symbols (␣ ↵ <U+200B>: core.tokens.WHITESPACE_SYMBOLS); ordinary tokens, CJK and emoji come back unchanged."""
    token = str(token)
    if token == "":
        return "∅"
    stripped = "".join(ch for ch in token if unicodedata.category(ch) not in _INVISIBLE_CATEGORIES)
    if stripped.strip() == "":
        token = "".join(WHITESPACE_SYMBOLS.get(ch, f"<U+{ord(ch):04X}>") if (
            ch.isspace() or unicodedata.category(ch) in _INVISIBLE_CATEGORIES) else ch
            for ch in token)
    if len(token) > MAX_LABEL_CHARS:
        token = token[: MAX_LABEL_CHARS - 1] + "…"
    return token


def tick_positions(n: int, max_ticks: int) -> list[int]:
    """Every k-th position (k chosen so at most `max_ticks` labels show)."""
    step = max(1, -(-n // max(1, max_ticks)))
    return list(range(0, n, step))


# --- Colour ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def colour_lut(cmap: str) -> np.ndarray:
    """[256, 3] uint8 lookup table for a matplotlib colormap name."""
    try:
        colormap = colormaps[cmap]
    except KeyError:
        raise ValueError(f"unknown colormap {cmap!r}; use a matplotlib name such as "
                         "'viridis', 'inferno' or 'magma'") from None
    return np.rint(colormap(np.linspace(0.0, 1.0, 256))[:, :3] * 255).astype(np.uint8)


def apply_colormap(values: np.ndarray, cmap: str = "viridis") -> np.ndarray:
    """Map values in [0, 1] (clipped; NaN -> 0) to RGB: [...] -> [..., 3] uint8."""
    values = np.nan_to_num(np.asarray(values, dtype=np.float32), nan=0.0, posinf=1.0, neginf=0.0)
    indices = np.rint(np.clip(values, 0.0, 1.0) * 255).astype(np.intp)
    return colour_lut(cmap)[indices]


def _numpy(values) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values)


def _finite(values: np.ndarray, what: str) -> np.ndarray:
    """NaN anywhere in a binary-string image blanks the whole plotly image: replace and log."""
    if not np.isfinite(values).all():
        logger.warning("%s contains NaN or inf; drawn as 0", what)
        values = np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
    return values


# --- Overview ----------------------------------------------------------------------------------
def overview_geometry(n: int, max_cell: int = 64, min_cell: int = 32) -> tuple[int, int]:
    """(pooled size m, integer upscale) of one overview cell; the cell is m * upscale pixels.
    Long inputs are pooled to at most `max_cell` entries; short ones are enlarged by whole
    pixels (no interpolation) so each cell is at least `min_cell` pixels wide."""
    block = -(-n // max_cell)                       # as in analysis.downsample_attention
    pooled = -(-n // block)
    return pooled, max(1, -(-min_cell // pooled))


def overview_image(attn, max_cell: int = 64, gap: int = 2, per_head: bool = True,
                   cmap: str = "viridis", min_cell: int = 32, off=None) -> np.ndarray:
    """All heads tiled (rows = layers, columns = heads) as one RGB image [Hpx, Wpx, 3] uint8.

    ``per_head`` scales each cell to its own maximum (patterns stay visible even when weights are
    small); otherwise one scale for all. ``off`` ([L, H] bool, True = switched off) fades heads.
    """
    attn = _numpy(attn)
    if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"attention must have shape [layers, heads, n, n], got {attn.shape}")
    n_layers, n_heads, n, _ = attn.shape
    if max_cell < 1 or gap < 0:
        raise ValueError("max_cell must be >= 1 and gap >= 0")
    pooled = downsample_attention(attn, max_cell).numpy()             # (L, H, m, m)
    pooled = _finite(pooled, "attention")
    scale_axes = (-2, -1) if per_head else (0, 1, 2, 3)
    peak = pooled.max(axis=scale_axes, keepdims=True)
    normalised = np.divide(pooled, peak, out=np.zeros_like(pooled), where=peak > 0)
    m, upscale = overview_geometry(n, max_cell, min_cell)
    cells = apply_colormap(normalised, cmap)                         # (L, H, m, m, 3)
    cells = cells.repeat(upscale, axis=2).repeat(upscale, axis=3)     # (L, H, c, c, 3)
    background = np.array(OVERVIEW_BACKGROUND, dtype=np.float32)
    if off is not None:
        off = _numpy(off).astype(bool)
        if off.shape != (n_layers, n_heads):
            raise ValueError(f"off must have shape [{n_layers}, {n_heads}], got {off.shape}")
        faded = cells * (1 - OFF_HEAD_FADE) + background * OFF_HEAD_FADE
        cells = np.where(off[:, :, None, None, None], np.rint(faded), cells).astype(np.uint8)
    cell = m * upscale
    # Pad every cell with `gap` background pixels below and right, tile, then crop the last gap.
    padded = np.empty((n_layers, n_heads, cell + gap, cell + gap, 3), dtype=np.uint8)
    padded[...] = OVERVIEW_BACKGROUND
    padded[:, :, :cell, :cell] = cells
    tiled = padded.transpose(0, 2, 1, 3, 4).reshape(          # (L*(c+gap), H*(c+gap), 3)
        n_layers * (cell + gap), n_heads * (cell + gap), 3)
    return np.ascontiguousarray(tiled[: tiled.shape[0] - gap, : tiled.shape[1] - gap])


# --- Patch maps over images ------------------------------------------------------------------
def _normalise_map(patch_map: np.ndarray, normalise: bool) -> np.ndarray:
    patch_map = _finite(np.asarray(patch_map, dtype=np.float32), "patch map")
    if not normalise:
        return np.clip(patch_map, 0.0, 1.0)
    low, high = float(patch_map.min()), float(patch_map.max())
    return (patch_map - low) / (high - low) if high > low else np.zeros_like(patch_map)


def overlay_patch_map(image: Image.Image, patch_map, alpha: float = 0.5, cmap: str = "inferno",
                      normalise: bool = True) -> Image.Image:
    """Blend a colour-mapped [gh, gw] patch map over the image (RGB out, image size kept).

    Patch (i, j) covers exactly image rows floor(i*H/gh) .. floor((i+1)*H/gh)-1 and the matching
    columns: nearest-neighbour, no blur, so one hot patch colours exactly its own pixels. For
    the model-input image (gh*p x gw*p) those are the patch's p x p pixels.
    """
    patch_map = _numpy(patch_map)
    if patch_map.ndim != 2 or 0 in patch_map.shape:
        raise ValueError(f"patch_map must be a 2-D [grid_h, grid_w] array, got {patch_map.shape}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be between 0 and 1, got {alpha}")
    rgb = np.asarray(image.convert("RGB"), dtype=np.float32)          # (H, W, 3)
    height, width = rgb.shape[:2]
    grid_h, grid_w = patch_map.shape
    heat = apply_colormap(_normalise_map(patch_map, normalise), cmap)  # (gh, gw, 3)
    rows = np.arange(height) * grid_h // height                      # patch row of each pixel row
    cols = np.arange(width) * grid_w // width
    heat_pixels = heat[rows][:, cols].astype(np.float32)              # (H, W, 3)
    blended = np.rint((1.0 - alpha) * rgb + alpha * heat_pixels)
    return Image.fromarray(blended.astype(np.uint8), mode="RGB")


def needs_cjk(text: str) -> bool:
    """True when `text` has a character from CJK Radicals (U+2E80) up, which DejaVu lacks."""
    return any(ord(ch) >= 0x2E80 for ch in text)


def label_font(size: int, text: str = "") -> ImageFont.ImageFont:
    """PIL's font for labels: the installed CJK font (`cjk_font_file`) when `text` needs it,
    else Pillow's default (DejaVu), which draws CJK as empty boxes."""
    if needs_cjk(text) and cjk_font_file() is not None:
        return ImageFont.truetype(cjk_font_file(), size)
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):       # Pillow without FreeType: fixed bitmap font
        return ImageFont.load_default()


TILE_LABEL_PX, TILE_GAP_PX = 18, 4   # grid_of_overlays: a label strip above each tile, a gap between tiles


def grid_of_overlays(image: Image.Image, maps, labels: list[str] | None = None,
                     columns: int | None = None, tile: int = 192, alpha: float = 0.5,
                     cmap: str = "inferno", normalise: bool = True, gap: int = TILE_GAP_PX) -> Image.Image:
    """Tile one overlay per map ([K, gh, gw], e.g. one per head or layer), labelled above."""
    maps = _numpy(maps)
    if maps.ndim != 3:
        raise ValueError(f"maps must be [K, grid_h, grid_w], got {maps.shape}")
    count = maps.shape[0]
    labels = [str(i) for i in range(count)] if labels is None else [str(s) for s in labels]
    if len(labels) != count:
        raise ValueError(f"{count} maps but {len(labels)} labels")
    columns = columns or min(count, 6)
    rows = -(-count // columns)
    tile_h = max(1, round(tile * image.height / image.width))
    base = image.convert("RGB").resize((tile, tile_h), Image.Resampling.BILINEAR)
    label_h = TILE_LABEL_PX
    canvas = Image.new("RGB", (columns * (tile + gap) - gap, rows * (tile_h + label_h + gap) - gap),
                       OVERVIEW_BACKGROUND)
    draw, font = ImageDraw.Draw(canvas), label_font(12, "".join(labels))
    for k in range(count):
        x = (k % columns) * (tile + gap)
        y = (k // columns) * (tile_h + label_h + gap)
        draw.text((x + 2, y + 2), labels[k], fill=(0, 0, 0), font=font)
        canvas.paste(overlay_patch_map(base, maps[k], alpha, cmap, normalise), (x, y + label_h))
    return canvas


# --- Bytes for download buttons ----------------------------------------------------------------
def image_png(rgb) -> bytes:
    """PNG bytes of an RGB array [H, W, 3] (uint8) or a PIL image."""
    if not isinstance(rgb, Image.Image):
        array = _numpy(rgb)
        if array.ndim != 3 or array.shape[-1] != 3:
            raise ValueError(f"expected an RGB array [H, W, 3], got {array.shape}")
        rgb = Image.fromarray(np.clip(array, 0, 255).astype(np.uint8), mode="RGB")
    buffer = io.BytesIO()
    rgb.save(buffer, format="PNG")
    return buffer.getvalue()


# The CJK font `make fonts` installs (Debian's fonts-wqy-zenhei), then another common one.
CJK_FONT_FILES = ("/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc", "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")


@functools.lru_cache(maxsize=1)
def cjk_font_file() -> str | None:
    """The first CJK font file installed (CJK_FONT_FILES), or None: PIL needs a path."""
    return next((path for path in CJK_FONT_FILES if os.path.isfile(path)), None)


@functools.lru_cache(maxsize=1)
def cjk_font_families() -> tuple[str, ...]:
    """Installed font families that cover CJK ideographs (checked by charmap, once). The CJK font
    file is added first: matplotlib's font list is a cache that may predate the font's install."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    path = cjk_font_file()
    if path is not None and path not in {entry.fname for entry in font_manager.fontManager.ttflist}:
        font_manager.fontManager.addfont(path)
    families = []
    for entry in font_manager.fontManager.ttflist:
        # Matplotlib bundles "Last Resort", which maps every code point to a placeholder box:
        # coverage without glyphs, so it does not count.
        if entry.name in families or entry.name.startswith("Last Resort"):
            continue
        try:
            if 0x4E00 in FT2Font(entry.fname).get_charmap():   # 一, the first CJK ideograph
                families.append(entry.name)
        except (OSError, RuntimeError, ValueError):
            continue
    return tuple(families)


EXPORT_DPI = 120
# rcParams (svg.fonttype) and warning filters are process-wide: serialise exports.
_EXPORT_LOCK = threading.Lock()


def _export_label(token: str) -> str:
    return visible_token(token).replace("$", r"\$")   # "$" would start matplotlib mathtext


MASKED_GREY, EXPORT_AXES = "#d0d0d0", ("key (attended to)", "query (attending)")   # the masked future


def static_heatmap(matrix, xlabels, ylabels, title, cmap, max_ticks, causal=False,
                    axis_titles=EXPORT_AXES) -> Figure:
    matrix = _finite(_numpy(matrix).astype(np.float32), "matrix")
    if matrix.ndim != 2 or matrix.shape != (len(ylabels), len(xlabels)):
        raise ValueError(f"matrix shape {matrix.shape} does not match {len(ylabels)} y labels "
                         f"x {len(xlabels)} x labels")
    n_rows, n_cols = matrix.shape
    size = (min(16, 3 + 0.18 * n_cols), min(16, 2.5 + 0.18 * n_rows))
    figure = Figure(figsize=size, layout="constrained")
    axes = figure.add_subplot()
    colours = colormaps[cmap].with_extremes(bad=MASKED_GREY)
    if causal:   # a query never sees later keys: grey, not "weight 0" in the colour scale
        matrix = np.where(np.triu(np.ones_like(matrix, dtype=bool), k=1), np.nan, matrix)
    image = axes.imshow(np.ma.masked_invalid(matrix), cmap=colours, aspect="auto",
                        interpolation="nearest", vmin=0)
    fonts = ["DejaVu Sans", *cjk_font_families()]   # fallback list: CJK glyphs when installed
    xticks, yticks = tick_positions(n_cols, max_ticks), tick_positions(n_rows, max_ticks)
    axes.set_xticks(xticks, [_export_label(xlabels[i]) for i in xticks], rotation=90,
                    fontfamily=fonts, fontsize=8)
    axes.set_yticks(yticks, [_export_label(ylabels[i]) for i in yticks], fontfamily=fonts,
                    fontsize=8)
    axes.set_title(_export_label(title) if title else "", fontfamily=fonts)
    axes.set_xlabel(axis_titles[0])
    axes.set_ylabel(axis_titles[1])
    figure.colorbar(image, ax=axes, fraction=0.04, label="attention weight")
    return figure


def _save(figure: Figure, fmt: str, rc: dict) -> bytes:
    import matplotlib

    buffer = io.BytesIO()
    with _EXPORT_LOCK, matplotlib.rc_context(rc), warnings.catch_warnings():
        # Without a CJK font matplotlib warns once per missing glyph; the tofu boxes say enough.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
        figure.savefig(buffer, format=fmt, dpi=EXPORT_DPI)
    return buffer.getvalue()


def figure_png(matrix, xlabels: list[str], ylabels: list[str], title: str = "",
               cmap: str = "viridis", max_ticks: int = 60, causal: bool = False) -> bytes:
    """PNG bytes of a static heatmap (rows = ylabels = queries, columns = xlabels = keys); with
    `causal`, the masked future (above the diagonal) is grey."""
    return _save(static_heatmap(matrix, xlabels, ylabels, title, cmap, max_ticks, causal), "png", {})


def figure_svg(matrix, xlabels: list[str], ylabels: list[str], title: str = "",
               cmap: str = "viridis", max_ticks: int = 60, causal: bool = False) -> bytes:
    """SVG bytes of the same heatmap. Text stays text (svg.fonttype none), so the viewer's own
    fonts draw CJK labels even where this machine has no CJK font."""
    return _save(static_heatmap(matrix, xlabels, ylabels, title, cmap, max_ticks, causal), "svg",
                 {"svg.fonttype": "none", "svg.hashsalt": "attnviz"})


# --- Overview export -------------------------------------------------------------------------
OVERVIEW_EXPORT_MIN_SIDE = 720     # px: a small overview is enlarged by whole pixels up to this
OVERVIEW_EXPORT_MARGINS = (70, 20, 100, 20)   # px left, right, top (title, head axis), bottom
MIN_TICK_PITCH = 16                # px between labelled ticks; denser grids label every k-th


def _overview_export_scale(height: int, width: int, max_pixels: int) -> float:
    """Whole-pixel enlargement up to the readable size, then shrunk to fit ``max_pixels``."""
    left, right, top, bottom = OVERVIEW_EXPORT_MARGINS
    scale = float(max(1, -(-OVERVIEW_EXPORT_MIN_SIDE // max(height, width))))
    while scale > 0.05 and (width * scale + left + right) * (height * scale + top + bottom) > max_pixels:
        scale = scale - 1 if scale > 1 else scale * 0.8
    return scale


def overview_export_figure(attn, per_head: bool = True, title: str = "", off=None,
                           max_cell: int = 64, cmap: str = "viridis",
                           max_pixels: int | None = None) -> Figure:
    """The all-heads overview (`overview_image`) as a matplotlib figure for export: head numbers
    along the top, layer numbers down the left, axis names and a title. Small overviews are
    enlarged by whole pixels (nearest neighbour) to about OVERVIEW_EXPORT_MIN_SIDE px; the saved
    image never exceeds ``max_pixels`` (LIMITS.max_render_pixels by default)."""
    attn = _numpy(attn)
    title = title if len(title) <= 120 else title[:119] + "…"
    rgb = overview_image(attn, max_cell=max_cell, per_head=per_head, cmap=cmap, off=off)
    n_layers, n_heads, n = attn.shape[0], attn.shape[1], attn.shape[-1]
    gap = 2                                                  # overview_image's default
    pooled, upscale = overview_geometry(n, max_cell)
    cell = pooled * upscale
    pitch = cell + gap
    height, width = rgb.shape[:2]
    max_pixels = LIMITS.max_render_pixels if max_pixels is None else int(max_pixels)
    scale = _overview_export_scale(height, width, max_pixels)
    left, right, top, bottom = OVERVIEW_EXPORT_MARGINS
    image_w, image_h = round(width * scale), round(height * scale)
    total_h = image_h + top + bottom
    total_w = max(image_w + left + right, round(len(title) * 11) + 40)   # room for the title
    left += (total_w - image_w - left - right) // 2                       # image centred
    figure = Figure(figsize=(total_w / EXPORT_DPI, total_h / EXPORT_DPI), dpi=EXPORT_DPI)
    axes = figure.add_axes((left / total_w, bottom / total_h, image_w / total_w, image_h / total_h))
    axes.imshow(rgb, interpolation="nearest" if scale >= 1 else "antialiased", aspect="auto")
    step_h = max(1, -(-MIN_TICK_PITCH // max(1, round(pitch * scale))))
    heads, layers = list(range(0, n_heads, step_h)), list(range(0, n_layers, step_h))
    axes.set_xticks([h * pitch + (cell - 1) / 2 for h in heads], [str(h) for h in heads],
                    fontsize=8)
    axes.set_yticks([layer * pitch + (cell - 1) / 2 for layer in layers],
                    [str(layer) for layer in layers], fontsize=8)
    axes.xaxis.tick_top()
    axes.xaxis.set_label_position("top")
    axes.set_xlabel("head")
    axes.set_ylabel("layer")
    for spine in axes.spines.values():
        spine.set_visible(False)
    if title:
        figure.text(0.5, 1 - 12 / total_h, title.replace("$", r"\$"), ha="center", va="top",
                    fontsize=11, fontfamily=["DejaVu Sans", *cjk_font_families()])
    return figure


def overview_png(attn, per_head: bool = True, title: str = "", off=None, max_cell: int = 64,
                 cmap: str = "viridis", max_pixels: int | None = None) -> bytes:
    """PNG bytes of `overview_export_figure`: every layer x head, labelled, at a readable size."""
    figure = overview_export_figure(attn, per_head=per_head, title=title, off=off,
                                    max_cell=max_cell, cmap=cmap, max_pixels=max_pixels)
    return _save(figure, "png", {})
