"""Pictures of the image reader's cross-attention (`attnviz.toys.image_reader`): for a generated
token, where its queries (text) landed on the keys (image patches), drawn as a heat overlay on the
picture, for the heads' mean and for each head; and one overlay per generated token."""
from __future__ import annotations

import numpy as np
from PIL import Image

from attnviz.figures.render import grid_of_overlays, visible_token

TILE = 320        # overlay width in pixels (the 64-pixel picture, scaled 5x)


def _upscaled(image: Image.Image) -> Image.Image:
    """The small grey picture, scaled up by whole pixels (no blur) before the overlay's tiles."""
    factor = max(1, TILE // image.width)
    return image.convert("RGB").resize((image.width * factor, image.height * factor), Image.Resampling.NEAREST)


def token_overlays(reading, step: int, layer: int, heads: list[int] | None = None, off=()) -> Image.Image:
    """One overlay for the heads' mean, then one per head of `heads` (default: all) of `layer`,
    for generated token `step`; heads in `off` (switched off) are labelled so. Each map is scaled
    to its own maximum."""
    n_heads = reading.cross.shape[1]
    if not 0 <= layer < reading.cross.shape[0] or not 0 <= step < reading.cross.shape[2]:
        raise ValueError(f"no layer {layer} / token {step} in this reading")
    heads = list(range(n_heads)) if heads is None else list(heads)
    maps = [reading.patch_map(step, layer)] + [reading.patch_map(step, layer, h) for h in heads]
    token = visible_token(reading.tokens[step])
    labels = [f"'{token}': mean of the heads"] + [
        f"'{token}': head {h}" + (" (off)" if h in off else "") for h in heads]
    return grid_of_overlays(_upscaled(reading.drawn.image), np.stack([m.numpy() for m in maps]), labels, columns=1,
                            tile=TILE, alpha=0.55)


def reading_strip(reading, layer: int, head: int | None = None) -> Image.Image:
    """One overlay per generated token (the heads' mean, or one head), left to right in reading order."""
    steps = reading.cross.shape[2]
    maps = np.stack([reading.patch_map(t, layer, head).numpy() for t in range(steps)])
    labels = [f"{t}: '{visible_token(tok)}'" for t, tok in enumerate(reading.tokens)]
    return grid_of_overlays(_upscaled(reading.drawn.image), maps, labels, columns=min(steps, 3),
                            tile=TILE // 2 + 40, alpha=0.55)
