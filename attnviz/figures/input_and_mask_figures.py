"""Pictures for the Lab's patches, padding and sparse-pattern view: arrays in, images and figures out.

Photos and masks are PIL images (drawn at once, exact pixels); token grids and attention are
plotly heatmaps with integer positions and token tick labels, as everywhere in attnviz.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from PIL import Image, ImageDraw

from attnviz.figures.attention_figures import head_heatmap, token_label
from attnviz.figures.image_figures import display_image
from attnviz.figures.lab_figures import matrix_figure
from attnviz.figures.render import label_font

GRID_COLOUR = (255, 255, 0)
CROP_COLOUR = (255, 64, 64)
SPECIAL_FILL = (60, 90, 160)      # [CLS] and register cells of the token strip
MASK_GAMMA = 0.4                   # a display pixel 1/8 computed reads mid-grey, not near-white


def crop_picture(photo: Image.Image, crop: tuple[int, int, int], max_side: int = 420) -> Image.Image:
    """The original photo with the centre square the model keeps outlined and the cut-off sides dimmed."""
    shown = display_image(photo, max_side).convert("RGB")
    scale = shown.size[0] / photo.size[0]
    left, top, side = (round(v * scale) for v in crop)
    dim = Image.new("RGB", shown.size, (0, 0, 0))
    box = (left, top, left + side, top + side)
    mask = Image.new("L", shown.size, 150)                 # 150/255 of black over the cut-off parts
    ImageDraw.Draw(mask).rectangle(box, fill=0)
    out = Image.composite(dim, shown, mask)
    ImageDraw.Draw(out).rectangle(box, outline=CROP_COLOUR, width=3)
    return out


def grid_picture(rgb: np.ndarray, patch_size: int, zoom: int = 2, numbers: bool = True,
                 first_token: int = 1) -> Image.Image:
    """The model input ([S, S, 3] uint8), enlarged `zoom` times, with the patch grid drawn over it
    and (when the cells are large enough) each patch's token index in its corner."""
    h, w = rgb.shape[:2]
    image = Image.fromarray(rgb).resize((w * zoom, h * zoom), Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(image)
    cell = patch_size * zoom
    for x in range(0, w * zoom + 1, cell):
        draw.line([(min(x, w * zoom - 1), 0), (min(x, w * zoom - 1), h * zoom)], fill=GRID_COLOUR, width=1)
    for y in range(0, h * zoom + 1, cell):
        draw.line([(0, min(y, h * zoom - 1)), (w * zoom, min(y, h * zoom - 1))], fill=GRID_COLOUR, width=1)
    if numbers and cell >= 20:
        font = label_font(max(8, cell // 3))
        cols = w // patch_size
        for i in range((h // patch_size) * cols):
            r, c = divmod(i, cols)
            x, y = c * cell + 2, r * cell + 1
            text = str(first_token + i)
            draw.text((x + 1, y + 1), text, fill=(0, 0, 0), font=font)
            draw.text((x, y), text, fill=(255, 255, 255), font=font)
    return image


def token_strip(patches: list[np.ndarray], prefix: list[str], per_row: int = 24, cell: int = 40,
                label_px: int = 14) -> Image.Image:
    """The token sequence as thumbnails in order: the prefix tokens ([CLS], registers) as coloured
    cells, then every patch ([P, P, 3] uint8) enlarged to `cell` px, each with its token index."""
    n = len(prefix) + len(patches)
    rows = -(-n // per_row)
    pitch_x, pitch_y = cell + 4, cell + label_px + 4
    image = Image.new("RGB", (per_row * pitch_x, rows * pitch_y), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    font, small = label_font(11), label_font(10)
    for t in range(n):
        r, c = divmod(t, per_row)
        x, y = c * pitch_x + 2, r * pitch_y + 2
        if t < len(prefix):
            draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=SPECIAL_FILL)
            draw.text((x + 3, y + cell // 2 - 6), prefix[t][:5], fill=(255, 255, 255), font=small)
        else:
            thumb = Image.fromarray(patches[t - len(prefix)]).resize((cell, cell), Image.Resampling.NEAREST)
            image.paste(thumb, (x, y))
        draw.text((x + 2, y + cell + 1), str(t), fill=(40, 40, 40), font=font)
    return image


def padded_grid_figure(tokens: list[list[str]], keep, pad_token: str) -> go.Figure:
    """The padded batch: one row per sentence, one column per position; real tokens blue, pads grey."""
    z = np.asarray(keep, dtype=np.float32)                                   # (B, W) 1 real, 0 pad
    text = [[token_label(t) for t in row] for row in tokens]
    figure = go.Figure(go.Heatmap(
        z=z, x=np.arange(z.shape[1]), y=np.arange(z.shape[0]), text=text, texttemplate="%{text}",
        colorscale=[[0, "#dddddd"], [1, "#9ecae1"]], zmin=0, zmax=1, showscale=False, xgap=2, ygap=2,
        hovertemplate="sentence %{y}, position %{x}: %{text}<extra></extra>"))
    figure.update_xaxes(title="position", tickmode="array", tickvals=np.arange(z.shape[1]))
    figure.update_yaxes(title="sentence", tickmode="array", tickvals=np.arange(z.shape[0]),
                        ticktext=[f"{b} ({int(z[b].sum())} real)" for b in range(z.shape[0])],
                        autorange="reversed")
    figure.update_layout(title=f"The padded batch: grey = {pad_token} (attention_mask 0)",
                         height=110 + 45 * z.shape[0], margin=dict(l=10, r=10, t=40, b=10))
    return figure


def key_mask_figure(allowed, tokens: list[str], title: str) -> go.Figure:
    """One sentence's (W, W) mask: 1 (dark) where query row i may look at key column j."""
    return matrix_figure(np.asarray(allowed, dtype=np.float32), title, tokens, tokens, row_title="query",
                         col_title="key", diverging=False, height=380)


def attention_figure(matrix, q_tokens: list[str], k_tokens: list[str], title: str, causal: bool,
                     zmax: float | None = None) -> go.Figure:
    return head_heatmap(matrix, q_tokens, k_tokens, title=title, causal=causal, zmax=zmax, height=380)


def mask_picture(mask, side: int = 220) -> Image.Image:
    """An (n, n) bool mask as a square picture about `side` px: allowed cells dark, skipped white.
    Larger masks are area-averaged (a grey pixel: part of its cells computed, brightened by
    MASK_GAMMA), so a one-cell-wide band never disappears; smaller ones are enlarged by a whole factor."""
    m = np.asarray(mask, dtype=np.float32)
    n = m.shape[0]
    if n >= side:   # the share of each display pixel's cells that are computed, in [0, 1]
        m = np.asarray(Image.fromarray(m, "F").resize((side, side), Image.Resampling.BOX))
        m = np.clip(m, 0, 1) ** MASK_GAMMA
    grey = Image.fromarray(np.round(255 * (1 - 0.85 * m)).astype(np.uint8), "L")
    factor = max(1, side // n)
    return grey.resize((grey.size[0] * factor,) * 2, Image.Resampling.NEAREST).convert("RGB")


def fraction_figure(names: list[str], fractions, title: str) -> go.Figure:
    """Share of the n x n scores each pattern computes, in percent, full at the top."""
    v = 100 * np.asarray(fractions, dtype=np.float64)
    figure = go.Figure(go.Bar(x=v, y=np.arange(len(names)), orientation="h",
                              text=[f"{a:.3g} %" for a in v], textposition="auto",
                              hovertemplate="%{x:.4g} % of the n² scores<extra></extra>"))
    figure.update_yaxes(tickmode="array", tickvals=np.arange(len(names)), ticktext=names, autorange="reversed")
    figure.update_xaxes(title="scores computed (% of n²)", range=[0, 105])
    figure.update_layout(title=title, height=60 * len(names) + 110, margin=dict(l=10, r=10, t=40, b=10))
    return figure
