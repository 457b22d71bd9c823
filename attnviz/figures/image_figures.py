"""Pictures of what vision heads look at: the photo as shown, per-head overlay grids, outlined patches.

The numbers (patch maps, rollout, artefacts) come from `attnviz.analysis.vision`; this module only
draws them. Every picture it draws has at most LIMITS.max_render_pixels pixels, whatever the shape
of the photo: a grid that would be larger is drawn with smaller tiles.
"""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageDraw

from attnviz.analysis.vision import patch_box
from attnviz.base.limits import LIMITS
from attnviz.base.names import head_name
from attnviz.figures import render

DISPLAY_MAX_SIDE = 640   # photos are shown (and overlaid) at most this large: fast, still sharp
MARK_COLOUR = (0, 255, 255)


def display_image(image: Image.Image, max_side: int = DISPLAY_MAX_SIDE) -> Image.Image:
    """A copy no larger than `max_side` on its longer side (aspect kept) for overlays.

    `max_side` is capped so the copy never has more than LIMITS.max_render_pixels pixels."""
    max_side = min(max_side, int(LIMITS.max_render_pixels ** 0.5))
    scale = max_side / max(image.size)
    if scale >= 1:
        return image.convert("RGB")
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.convert("RGB").resize(size, Image.Resampling.BILINEAR)


def layer_head_labels(layers: list[int], n_heads: int, off=None) -> list[str]:
    """The head name (`L3H2`) per (layer, head), rows first; " (off)" where `off` ([L, H] bool) is True."""
    labels = []
    for i, layer in enumerate(layers):
        for head in range(n_heads):
            switched_off = off is not None and bool(off[i][head])
            labels.append(head_name(layer, head) + (" (off)" if switched_off else ""))
    return labels


def overlay_grid_size(image_size: tuple[int, int], rows: int, columns: int, tile: int
                      ) -> tuple[int, int]:
    """(width, height) of `render.grid_of_overlays` for `rows` x `columns` tiles `tile` px wide
    of an image of `image_size` = (width, height)."""
    width, height = image_size
    tile_h = max(1, round(tile * height / width))
    gap, label = render.TILE_GAP_PX, render.TILE_LABEL_PX
    return columns * (tile + gap) - gap, rows * (tile_h + label + gap) - gap


def overlay_tile(image_size: tuple[int, int], rows: int, columns: int, tile: int,
                 max_pixels: int | None = None) -> int:
    """The widest tile, at most `tile` px, whose overlay grid has at most `max_pixels` pixels
    (LIMITS.max_render_pixels)."""
    max_pixels = LIMITS.max_render_pixels if max_pixels is None else max_pixels
    if tile < 1 or rows < 1 or columns < 1 or min(image_size) < 1:
        raise ValueError(f"cannot draw {rows} x {columns} tiles {tile} px wide of a "
                         f"{image_size[0]}×{image_size[1]} image")

    def area(t: int) -> int:
        width, height = overlay_grid_size(image_size, rows, columns, t)
        return width * height

    if area(1) > max_pixels:
        raise ValueError(
            f"{rows} x {columns} overlays of a {image_size[0]}×{image_size[1]} px image do not "
            f"fit in {max_pixels:,} pixels even as 1-px tiles: show fewer layers or heads, or "
            "crop the image closer to square.")
    low, high = 1, tile                      # area grows with the tile: largest fitting one
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if area(middle) <= max_pixels else (low, middle - 1)
    return low


def map_range(maps) -> tuple[float, float]:
    """(min, max) of the maps: the ends of the one colour scale `head_overlays(shared=True)` uses."""
    maps = torch.as_tensor(maps).float()
    return float(maps.min()), float(maps.max())


def colour_bar(low: str, high: str, width: int = 320, cmap: str = "inferno", title: str = "") -> Image.Image:
    """A horizontal colour bar (the overlays' colormap, left = `low`, right = `high`), labelled."""
    bar_h, text_h = 14, 16
    ramp = render.apply_colormap(np.linspace(0.0, 1.0, width)[None, :].repeat(bar_h, 0), cmap)  # (h, w, 3)
    canvas = Image.new("RGB", (width, bar_h + 2 * text_h), render.OVERVIEW_BACKGROUND)
    canvas.paste(Image.fromarray(ramp, mode="RGB"), (0, text_h))
    draw = ImageDraw.Draw(canvas)
    font = render.label_font(12, low + high + title)
    draw.text((0, text_h + bar_h + 1), low, fill=(0, 0, 0), font=font)
    draw.text((width - 1, text_h + bar_h + 1), high, fill=(0, 0, 0), font=font, anchor="ra")
    if title:
        draw.text((width // 2, 1), title, fill=(0, 0, 0), font=font, anchor="ma")
    return canvas


def head_overlays(image: Image.Image, maps, layers: list[int], tile: int = 128,
                  alpha: float = 0.5, cmap: str = "inferno", off=None,
                  max_pixels: int | None = None, shared: bool = False) -> Image.Image:
    """One labelled tile per head: rows = layers, columns = heads (maps [L, H, gh, gw]).

    Each tile is scaled to its own min..max, so weak heads still show their pattern; with
    `shared`, all tiles share one scale (`map_range`), so tiles compare by colour. `off`
    ([L, H] bool, rows matching `layers`) marks switched-off heads in the labels. Tiles are
    `tile` px wide unless the whole grid would then pass `max_pixels` (many heads, a tall photo):
    then they are as wide as fits. Raises ValueError when not even 1-px-wide tiles fit."""
    maps = torch.as_tensor(maps)
    if maps.ndim != 4:
        raise ValueError(f"maps must be [layers, heads, grid_h, grid_w], got {tuple(maps.shape)}")
    n_layers, n_heads = maps.shape[:2]
    if len(layers) != n_layers:
        raise ValueError(f"{n_layers} layers of maps but {len(layers)} layer labels")
    fitting = overlay_tile(image.size, n_layers, n_heads, tile, max_pixels)
    flat = maps.reshape(n_layers * n_heads, *maps.shape[2:]).float()          # (L*H, gh, gw)
    if shared:
        low, high = map_range(flat)
        flat = (flat - low) / (high - low) if high > low else torch.zeros_like(flat)
    return render.grid_of_overlays(image, flat, layer_head_labels(layers, n_heads, off),
                                   columns=n_heads, tile=fitting, alpha=alpha, cmap=cmap, normalise=not shared)


def mark_patches(image: Image.Image, patches: list[tuple[int, int]], grid: tuple[int, int],
                 colour=MARK_COLOUR, width: int | None = None) -> Image.Image:
    """A copy of the image with each (row, col) patch outlined (line width ~1 % of the image,
    so the outline survives being shrunk into a tile)."""
    marked = image.convert("RGB").copy()
    width = width or max(2, max(marked.size) // 100)
    draw = ImageDraw.Draw(marked)
    for row, col in patches:
        draw.rectangle(patch_box(row, col, grid, marked.size), outline=colour, width=width)
    return marked
