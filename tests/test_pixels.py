"""fit_square and preprocess: an RGB image -> the normalised tensor a vision model takes."""
import numpy as np
import pytest
import torch
from PIL import Image

from attnviz.core import pixels
from attnviz.core.pixels import IMAGENET_MEAN, IMAGENET_STD, preprocess

RED, BLUE, WHITE = (255, 0, 0), (0, 0, 255), (255, 255, 255)


def halves(width=90, height=60) -> Image.Image:
    """Left half black, right half yellow."""
    rgb = np.zeros((height, width, 3), np.uint8)
    rgb[:, width // 2:] = (250, 200, 0)
    return Image.fromarray(rgb)


def test_preprocess_shape_and_normalisation():
    mean_colour = tuple(round(m * 255) for m in IMAGENET_MEAN)
    pixels = preprocess(Image.new("RGB", (300, 200), mean_colour), 224)
    assert pixels.shape == (3, 224, 224) and pixels.dtype == torch.float32
    assert pixels.abs().max() < 0.01  # the mean colour normalises to ~0

    white = preprocess(Image.new("RGB", (50, 70), WHITE), 112)
    expected = [(1 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD)]
    assert torch.allclose(white.mean(dim=(1, 2)), torch.tensor(expected), atol=1e-6)


def test_preprocess_puts_left_on_left_and_red_in_channel_0():
    image = Image.new("RGB", (280, 140), BLUE)
    image.paste(RED, (0, 0, 140, 140))
    pixels = preprocess(image, 224, mean=(0, 0, 0), std=(1, 1, 1), fit="squeeze")
    assert torch.allclose(pixels[:, 100, 10], torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(pixels[:, 100, 210], torch.tensor([0.0, 0.0, 1.0]))


def test_preprocess_matches_the_transformers_processor():
    from transformers import BitImageProcessorPil  # the backend the DINOv2 processor uses

    processor = BitImageProcessorPil(
        size={"height": 224, "width": 224},
        do_center_crop=False,
        image_mean=IMAGENET_MEAN,
        image_std=IMAGENET_STD,
    )
    noise = np.random.default_rng(2).integers(0, 256, (150, 260, 3), dtype=np.uint8)
    image = Image.fromarray(noise)
    reference = processor(image, return_tensors="pt")["pixel_values"][0]
    assert torch.allclose(preprocess(image, 224, fit="squeeze"), reference, atol=1e-5)


def test_preprocess_composites_alpha_like_open_image():
    transparent = Image.new("RGBA", (20, 20), (0, 0, 0, 0))
    pixels = preprocess(transparent, 112, mean=(0, 0, 0), std=(1, 1, 1))
    assert torch.all(pixels == 1.0)


@pytest.mark.parametrize("size", [0, -14, 100, 98, 462, 224.0])
def test_preprocess_refuses_bad_sizes(size):
    with pytest.raises(ValueError, match="Image size"):
        preprocess(Image.new("RGB", (10, 10)), size)


def test_preprocess_bounds_and_patch_size_are_keywords():
    image = Image.new("RGB", (10, 10))
    assert preprocess(image, 32, patch_size=16, min_size=32).shape == (3, 32, 32)
    assert preprocess(image, 476, max_size=476).shape == (3, 476, 476)
    with pytest.raises(ValueError, match="std"):
        preprocess(image, 224, std=(0.2, 0.0, 0.2))


def test_fit_square_crop_pad_squeeze_pixels():
    photo = halves()                                        # 90 x 60: left half black, right yellow
    crop = pixels.fit_square(photo)
    assert crop.size == (60, 60)
    assert np.array_equal(np.asarray(crop), np.asarray(photo)[:, 15:75])       # the centre square
    pad = pixels.fit_square(photo, "pad", (0.5, 0.5, 0.5))
    assert pad.size == (90, 90)
    assert np.array_equal(np.asarray(pad)[15:75], np.asarray(photo))
    assert (np.asarray(pad)[:15] == 128).all() and (np.asarray(pad)[75:] == 128).all()
    assert pixels.fit_square(photo, "squeeze").size == (90, 60)
    with pytest.raises(ValueError, match="crop, pad, squeeze"):
        pixels.fit_square(photo, "stretch")
    # preprocess: crop by default (nothing stretched), the mean-colour bars normalise to 0
    plain_stats = dict(mean=(0, 0, 0), std=(1, 1, 1), patch_size=14)
    assert np.allclose(pixels.preprocess(photo, 112, **plain_stats).numpy(),
                       pixels.preprocess(crop, 112, **plain_stats).numpy())
    padded = pixels.preprocess(photo, 112, fit="pad", patch_size=14)
    assert padded[:, :10].abs().max() < 1e-2                 # the top bar: the mean colour
    assert not np.allclose(pixels.preprocess(photo, 112, fit="squeeze", **plain_stats).numpy(),
                           pixels.preprocess(crop, 112, **plain_stats).numpy())
