"""The pixels a vision model takes: an RGB image made square (`fit_square`), resized to the model's
input size and normalised by its mean and std (`preprocess`). Decoding uploaded files into RGB is
the layer below (`attnviz.uploads.images`).
"""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from attnviz.base.limits import LIMITS
from attnviz.uploads.colour import to_rgb

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

FITS = ("crop", "pad", "squeeze")


def fit_square(image: Image.Image, fit: str = "crop", fill=IMAGENET_MEAN) -> Image.Image:
    """A square RGB copy of the image: "crop" keeps the centre square (the edges of the longer
    side are cut off), "pad" adds bars of `fill` (RGB in [0, 1]; the mean colour normalises to
    0) on the shorter side, "squeeze" leaves the image as it is (resizing then stretches it)."""
    if fit not in FITS:
        raise ValueError(f"fit must be one of {', '.join(FITS)}; got {fit!r}")
    rgb = to_rgb(image)
    width, height = rgb.size
    if fit == "squeeze" or width == height:
        return rgb
    side = min(width, height) if fit == "crop" else max(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    if fit == "crop":
        return rgb.crop((left, top, left + side, top + side))
    square = Image.new("RGB", (side, side), tuple(round(255 * c) for c in fill))
    square.paste(rgb, (-left, -top))
    return square


def preprocess(
    image: Image.Image,
    size: int = 224,
    mean: tuple[float, float, float] = IMAGENET_MEAN,
    std: tuple[float, float, float] = IMAGENET_STD,
    patch_size: int = 14,
    *,
    min_size: int | None = None,
    max_size: int | None = None,
    fit: str = "crop",
) -> torch.Tensor:
    """PIL image → normalised FloatTensor [3, size, size].

    A non-square image is first made square (`fit_square`): by default its centre square is
    kept, as the transformers DINOv2 processor does (shortest edge, centre crop), so nothing is
    stretched; "pad" keeps every pixel in view with mean-colour bars (patches wasted on padding);
    "squeeze" stretches the whole image. The square is resized to size x size with Pillow's
    bicubic filter (antialiased when shrinking), the filter that processor uses. With "squeeze"
    this equals `BitImageProcessorPil` with `size={"height": size, "width": size},
    do_center_crop=False` and these mean/std.
    """
    min_size = LIMITS.min_image_side if min_size is None else min_size
    max_size = LIMITS.max_image_side if max_size is None else max_size
    if not isinstance(size, int) or size <= 0 or size % patch_size:
        raise ValueError(f"Image size must be a positive multiple of {patch_size}, got {size!r}.")
    if not min_size <= size <= max_size:
        raise ValueError(
            f"Image size must be between {min_size} and {max_size} pixels, got {size}."
        )
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise ValueError(f"mean and std need 3 values each, std > 0; got {mean!r}, {std!r}.")
    rgb = fit_square(image, fit, mean)
    resized = rgb.resize((size, size), Image.Resampling.BICUBIC)
    pixels = np.asarray(resized, dtype=np.float32) / np.float32(255.0)  # (H, W, 3) in [0, 1]
    pixels = (pixels - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))  # (3, H, W)
