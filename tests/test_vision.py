"""attnviz.vision: patch maps land on the right pixels, artefact flags, head-mask metrics, export."""
import io

import numpy as np
import pytest
import torch
from PIL import Image

import attnviz
from attnviz.analysis import vision
from attnviz.base.limits import LIMITS
from attnviz.figures import attention_figures
from attnviz.figures import image_figures
from attnviz.core.model import Trace
from attnviz.figures import render
from attnviz.figures.render import colour_lut
from tests.test_parity import tiny

GRID = (4, 5)          # deliberately not square: rows and columns must not be swapped
N_PREFIX = 1
N = N_PREFIX + GRID[0] * GRID[1]


def synthetic_trace(attn, states=None, saliency=None, hidden=None, grid=GRID, n_prefix=N_PREFIX):
    n = attn.shape[-1]
    tokens = ["CLS"] + [f"p{r},{c}" for r in range(grid[0]) for c in range(grid[1])]
    return Trace(tokens=tokens, attentions=attn, hidden=hidden if hidden is not None else torch.ones(n, 8),
                 logits=None, layers=list(range(attn.shape[0])), grid=grid, n_prefix=n_prefix,
                 saliency=saliency, states=states)


def one_hot_attention(layers=2, heads=3, query=0, key=7, rest="self"):
    """Every row attends to itself (identity), except `query`, which puts all mass on `key`."""
    attn = torch.eye(N).repeat(layers, heads, 1, 1)                      # (L, H, n, n)
    attn[:, :, query] = 0
    attn[:, :, query, key] = 1
    return attn


def token_of(row, col):
    return N_PREFIX + row * GRID[1] + col


# --- Patch to pixel, end to end -------------------------------------------------------------------
@pytest.mark.parametrize("image_size", [(5 * 14, 4 * 14), (103, 61)])  # model input, odd photo
def test_one_hot_cls_attention_colours_exactly_that_patchs_pixels(image_size):
    row, col = 2, 3
    tr = synthetic_trace(one_hot_attention(key=token_of(row, col)))
    maps = vision.cls_maps(tr)
    assert maps.shape == (2, 3, *GRID)
    expected = torch.zeros(GRID)
    expected[row, col] = 1
    assert torch.equal(maps[1, 2], expected)

    photo = Image.new("RGB", image_size, (10, 20, 30))
    out = np.asarray(render.overlay_patch_map(photo, maps[1, 2], alpha=1.0, cmap="inferno"))
    lut = colour_lut("inferno")
    left, top, right, bottom = vision.patch_box(row, col, GRID, photo.size)
    hot = np.zeros(out.shape[:2], bool)
    hot[top:bottom + 1, left:right + 1] = True
    assert (out[hot] == lut[255]).all() and (out[~hot] == lut[0]).all()
    if image_size == (70, 56):   # the model's own input: the patch is exactly its 14 x 14 pixels
        assert (left, top, right, bottom) == (col * 14, row * 14, col * 14 + 13, row * 14 + 13)


def test_patch_query_maps_follow_the_chosen_patch():
    row, col, target = 3, 1, (0, 4)
    tr = synthetic_trace(one_hot_attention(query=token_of(row, col), key=token_of(*target)))
    query = vision.patch_query_maps(tr, row, col)                         # (L, H, gh, gw)
    assert query.shape == (2, 3, *GRID)
    assert query[0, 0, target[0], target[1]] == 1 and query.sum() == 2 * 3
    other = vision.patch_query_maps(tr, 0, 0)                             # attends to itself
    assert other[1, 1, 0, 0] == 1 and other[1, 1].sum() == 1
    assert vision.patch_token(tr, 3, 4) == N - 1
    with pytest.raises(ValueError, match="outside the 4 x 5 grid"):
        vision.patch_query_maps(tr, 4, 0)


def test_rollout_map_carries_one_hot_cls_attention_through_the_layers():
    tr = synthetic_trace(one_hot_attention(key=token_of(1, 2)))
    flow = vision.rollout_map(tr, residual=False)
    expected = torch.zeros(GRID)
    expected[1, 2] = 1
    assert torch.allclose(flow, expected)
    # With the residual term CLS keeps half for itself per layer: 1/4 on CLS, 3/4 on the patch.
    assert vision.rollout_map(tr)[1, 2] == pytest.approx(0.75)


def test_rollout_map_leaves_switched_off_heads_out():
    attn = torch.eye(N).repeat(1, 2, 1, 1)
    attn[0, 1, 0] = 0
    attn[0, 1, 0, token_of(0, 0)] = 1              # only head 1 moves CLS onto patch (0, 0)
    tr = synthetic_trace(attn)
    assert vision.rollout_map(tr, residual=False)[0, 0] == pytest.approx(0.5)
    assert vision.rollout_map(tr, torch.tensor([[1.0, 0.0]]), residual=False).sum() == 0


def test_attention_distance_in_pixels_ignores_cls_mass():
    patch = 16
    attn = torch.zeros(1, 2, N, N)
    attn[0, 0] = torch.eye(N)                       # head 0: every patch looks at itself
    attn[0, 1, :, token_of(0, 0)] = 0.5             # head 1: half on patch (0, 0), half on CLS
    attn[0, 1, :, 0] = 0.5
    distance = vision.attention_distance_px(synthetic_trace(attn), patch)
    rows, cols = np.meshgrid(np.arange(GRID[0]), np.arange(GRID[1]), indexing="ij")
    expected = np.hypot(rows, cols).mean() * patch  # every patch's distance to (0, 0), in px
    assert distance[0, 0] == 0
    assert distance[0, 1] == pytest.approx(expected, rel=1e-6)


def test_head_overlays_tile_rows_as_layers_and_mark_off_heads():
    maps = torch.rand(2, 3, *GRID)
    photo = Image.new("RGB", (50, 40))
    grid = image_figures.head_overlays(photo, maps, [4, 7], tile=50, off=torch.tensor([[0, 1, 0], [0, 0, 0]]))
    assert grid.size == (3 * 54 - 4, 2 * (40 + 18 + 4) - 4)
    assert image_figures.layer_head_labels([4, 7], 3, [[0, 1, 0], [0, 0, 0]])[:3] == [
        "L4H0", "L4H1 (off)", "L4H2"]
    with pytest.raises(ValueError, match="layer labels"):
        image_figures.head_overlays(photo, maps, [4])


def test_mark_patches_outlines_the_patch_box():
    photo = Image.new("RGB", (70, 56))
    marked = np.asarray(image_figures.mark_patches(photo, [(1, 2)], GRID, width=1))
    left, top, right, bottom = vision.patch_box(1, 2, GRID, photo.size)
    assert (left, top, right, bottom) == (28, 14, 41, 27)
    assert (marked[top, left:right + 1] == image_figures.MARK_COLOUR).all()
    assert (marked[bottom, left:right + 1] == image_figures.MARK_COLOUR).all()
    assert (marked[top + 1:bottom, left + 1:right] == 0).all()          # inside stays untouched


# --- Odd shapes: tiny photos, strips, many heads -----------------------------------------------
@pytest.mark.parametrize("size", [(1, 1), (13, 40), (40, 13)])
def test_photos_smaller_than_one_patch_are_refused(size):
    with pytest.raises(ValueError, match=f"{size[0]}×{size[1]} px, smaller than one 14×14-px patch"):
        vision.check_photo(Image.new("RGB", size), patch_size=14)


def test_check_photo_accepts_one_patch_and_refuses_strips():
    vision.check_photo(Image.new("RGB", (14, 14)), patch_size=14)
    vision.check_photo(Image.new("RGB", (14, 280)), patch_size=14)         # exactly 20:1
    with pytest.raises(ValueError, match="times as tall .* limit is 20:1"):
        vision.check_photo(Image.new("RGB", (14, 281)), patch_size=14)


@pytest.mark.parametrize("size", [(1, 1), (1, 640), (14, 14), (640, 3)])
def test_mark_patches_works_on_images_with_fewer_pixels_than_patches(size):
    # The 1 x 1 GIF of the issue crashed here (rectangle x1 < x0) for patches that own no pixel.
    photo = Image.new("RGB", size)
    grid = (16, 16)
    for row, col in [(0, 0), (8, 8), (15, 15), (3, 12)]:
        left, top, right, bottom = vision.patch_box(row, col, grid, size)
        assert 0 <= left <= right < size[0] and 0 <= top <= bottom < size[1]
        marked = np.asarray(image_figures.mark_patches(photo, [(row, col)], grid))
        assert (marked[top, left] == image_figures.MARK_COLOUR).all()


def test_patch_boxes_are_unchanged_where_every_patch_owns_pixels():
    assert vision.patch_box(1, 2, GRID, (70, 56)) == (28, 14, 41, 27)
    assert vision.patch_box(3, 4, GRID, (103, 61)) == (83, 46, 102, 60)


def test_head_overlays_of_a_strip_stay_within_the_render_cap():
    # The 1 x 640 PNG: 224-px tiles would make a 1364 x 143,378 canvas (196 Mpx).
    strip = Image.new("RGB", (1, 640))
    maps = torch.rand(1, 6, 16, 16)
    grid = image_figures.head_overlays(strip, maps, [11], tile=224)
    assert grid.width * grid.height <= LIMITS.max_render_pixels == 16_000_000
    small = image_figures.head_overlays(strip, maps, [11], tile=224, max_pixels=100_000)
    assert small.width * small.height <= 100_000


def test_head_overlays_of_many_heads_of_a_tall_photo_stay_within_the_render_cap():
    tall = Image.new("RGB", (32, 640))                                    # 20:1, as shown
    grid = image_figures.head_overlays(tall, torch.rand(12, 6, 16, 16), list(range(12)), tile=160)
    assert grid.width * grid.height <= LIMITS.max_render_pixels


def test_head_overlays_refuse_what_cannot_fit_even_as_1_px_tiles():
    with pytest.raises(ValueError, match="do not fit in 400 pixels even as 1-px tiles"):
        image_figures.head_overlays(Image.new("RGB", (50, 40)), torch.rand(2, 3, *GRID), [0, 1],
                             max_pixels=400)


@pytest.mark.parametrize("size, rows, columns, tile", [
    ((50, 40), 2, 3, 50), ((1, 640), 1, 6, 62), ((640, 3), 12, 6, 112), ((103, 61), 4, 4, 7)])
def test_overlay_grid_size_matches_what_render_draws(size, rows, columns, tile):
    maps = torch.rand(rows, columns, 2, 2)
    drawn = image_figures.head_overlays(Image.new("RGB", size), maps, list(range(rows)), tile=tile)
    assert drawn.size == image_figures.overlay_grid_size(size, rows, columns, tile)


def test_overlay_tile_is_the_widest_that_fits():
    size, rows, columns = (1, 640), 1, 6
    tile = image_figures.overlay_tile(size, rows, columns, 224)
    area = lambda t: np.prod(image_figures.overlay_grid_size(size, rows, columns, t))  # noqa: E731
    assert area(tile) <= LIMITS.max_render_pixels < area(tile + 1)
    assert image_figures.overlay_tile((640, 480), 12, 6, 160) == 160            # a photo: unchanged


def test_display_image_is_bounded_for_any_shape():
    for size in [(1, 1), (1, 640), (5000, 20), (3000, 4000)]:
        shown = image_figures.display_image(Image.new("RGB", size))
        assert max(shown.size) <= image_figures.DISPLAY_MAX_SIDE and min(shown.size) >= 1


def test_resolution_options_and_token_count():
    sizes = vision.resolution_options(14)
    assert sizes[0] == 112 and sizes[-1] == 448 and len(sizes) == 25
    assert all(s % 14 == 0 for s in sizes)
    assert vision.resolution_options(16)[:2] == [112, 128]
    assert vision.token_count(224, 14) == 257 and vision.token_count(448, 14, 5) == 1029
    with pytest.raises(ValueError, match="no multiple"):
        vision.resolution_options(500)


def test_model_resolutions_stay_within_the_attention_budget(tiny_dinov2):
    sizes = vision.model_resolutions(tiny_dinov2)                      # patch 7, 2 x 4 heads
    # 448 px = 4,097 tokens: 2 x 4 x 4097^2 x 4 bytes = 537 MB, over 512 MiB; 441 px fits.
    assert sizes == vision.resolution_options(7)[:-1] and sizes[-1] == 441
    budget = vision.attention_bytes(140, tiny_dinov2)
    assert vision.attention_bytes(140, tiny_dinov2) == 2 * 4 * (20 * 20 + 1) ** 2 * 4
    assert vision.model_resolutions(tiny_dinov2, budget)[-1] == 140
    assert vision.model_resolutions(tiny_dinov2, 1) == [112]           # never empty


# --- Artefact tokens ------------------------------------------------------------------------------
def test_flag_high_norm_finds_exactly_the_outliers():
    norms = torch.tensor([10.0, 11, 9, 10.5, 9.5, 10, 30, 10.2, 9.8, 45])
    flags, median, mad, threshold = vision.flag_high_norm(norms, k=6)
    assert median == pytest.approx(10.1) and mad == pytest.approx(0.5)   # |dev| mid: 0.4, 0.6
    assert threshold == pytest.approx(13.1)
    assert flags.nonzero().flatten().tolist() == [6, 9]
    flags, *_ = vision.flag_high_norm(torch.full((9,), 3.0))            # all equal: none
    assert not flags.any()
    flags, *_ = vision.flag_high_norm(torch.tensor([1.0, 1, 1, 1, 1, 8]))  # MAD 0: above the rest
    assert flags.tolist() == [False] * 5 + [True]
    with pytest.raises(ValueError, match="positive"):
        vision.flag_high_norm(norms, k=0)


def test_find_artefacts_reads_the_chosen_layer_on_the_patch_grid():
    gen = torch.Generator().manual_seed(0)
    states = [torch.randn(N, 16, generator=gen) for _ in range(4)]     # 3 blocks + final output
    states[2][token_of(3, 1)] *= 40                                      # the last block's input
    states[2][0] *= 100                                                  # CLS is not a patch
    tr = synthetic_trace(torch.eye(N).repeat(3, 1, 1, 1), states=states)
    found = vision.find_artefacts(tr)
    assert found.layer == 2 and found.norms.shape == GRID
    assert found.patches == [(3, 1)]
    assert found.robust_z[3, 1] > vision.ARTEFACT_K
    assert vision.find_artefacts(tr, layer=0).patches == []
    with pytest.raises(ValueError, match="0..3"):
        vision.find_artefacts(tr, layer=4)
    with pytest.raises(ValueError, match="states=True"):
        vision.find_artefacts(synthetic_trace(torch.eye(N)[None, None]))


# --- Effect of a head mask ---------------------------------------------------------------------------
def test_saliency_iou_and_mask_effect_are_exact():
    before = torch.zeros(4, 4)
    before[0, :4] = 0.9                          # 4 pixels on
    after = torch.zeros(4, 4)
    after[0, :2] = 0.6                           # 2 of them stay on, nothing new: IoU 2/4
    assert vision.saliency_iou(before, after) == 0.5
    assert vision.saliency_iou(torch.zeros(3, 3), torch.full((3, 3), 0.49)) == 1.0
    hidden_a, hidden_b = torch.zeros(N, 2), torch.zeros(N, 2)
    hidden_a[0] = torch.tensor([1.0, 0.0])
    hidden_b[0] = torch.tensor([1.0, 1.0])        # 45 degrees
    attn = torch.eye(N)[None, None]
    a = synthetic_trace(attn, saliency=before, hidden=hidden_a)
    b = synthetic_trace(attn, saliency=after, hidden=hidden_b)
    mask = torch.ones(2, 3)
    mask[1, 2] = 0
    effect = vision.mask_effect(a, b, mask)
    assert effect.heads_off == 1
    assert effect.cls_cosine == pytest.approx(2 ** -0.5)
    assert effect.saliency_iou == 0.5
    # |change|: two pixels 0.9 -> 0.6, two pixels 0.9 -> 0, twelve unchanged.
    assert effect.saliency_mean_abs_change == pytest.approx((2 * 0.3 + 2 * 0.9) / 16)
    no_decoder = vision.mask_effect(synthetic_trace(attn, hidden=hidden_a), b)
    assert no_decoder.saliency_iou is None and no_decoder.heads_off == 0


# --- A real (tiny) DINOv2 through Model.trace ----------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dinov2():
    return attnviz.from_hf(tiny("dinov2"))


def test_vision_maps_on_a_real_trace(tiny_dinov2):
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 60, 3), np.uint8))
    tr = tiny_dinov2.trace(photo, image_size=112, states=True)          # patch 7: 16 x 16
    assert tr.grid == (16, 16)
    maps = vision.cls_maps(tr)
    assert torch.equal(maps, tr.attentions[:, :, 0, 1:].reshape(2, 4, 16, 16))
    assert vision.find_artefacts(tr).norms.shape == (16, 16)
    same = vision.mask_effect(tr, tiny_dinov2.trace(photo, image_size=112))
    assert same.cls_cosine == pytest.approx(1.0, abs=1e-6) and same.saliency_iou is None
    mask = torch.ones(2, 4)
    mask[0] = 0
    masked = tiny_dinov2.trace(photo, head_mask=mask, image_size=112)
    changed = vision.mask_effect(tr, masked, mask)
    expected = torch.nn.functional.cosine_similarity(tr.hidden[0], masked.hidden[0], dim=0)
    assert changed.heads_off == 4 and changed.cls_cosine < 1 - 1e-6   # tiny init: small change
    assert changed.cls_cosine == pytest.approx(float(expected), abs=1e-6)
    assert vision.default_resolution(tiny_dinov2) == 112               # its own 28 px is too small


def test_maps_npz_round_trips_without_pickles(tiny_dinov2):
    photo = Image.new("RGB", (30, 30), (200, 10, 10))
    mask = torch.ones(2, 4)
    mask[0, 1] = 0
    tr = tiny_dinov2.trace(photo, head_mask=mask, image_size=112, states=True)
    found = vision.find_artefacts(tr)
    data = vision.maps_npz(tr, 7, head_mask=mask, query=(2, 5), artefacts=found)
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        np.testing.assert_array_equal(npz["cls_maps"], vision.cls_maps(tr).numpy())
        np.testing.assert_array_equal(npz["query_maps"], vision.patch_query_maps(tr, 2, 5).numpy())
        np.testing.assert_array_equal(npz["rollout"], vision.rollout_map(tr, mask).numpy())
        np.testing.assert_array_equal(npz["head_mask"], mask.numpy())
        np.testing.assert_array_equal(npz["artefact_flags"], found.flags.numpy())
        assert npz["mean_distance_px"].shape == (2, 4)
        assert npz["grid"].tolist() == [16, 16] and npz["image_size"].tolist() == [112, 112]
        assert npz["query"].tolist() == [2, 5] and int(npz["patch_size"]) == 7
        assert "saliency" not in npz.files                              # no decoder on this model


@pytest.mark.parametrize("mode", ["RGBA", "I;16", "CMYK", "P", "L", "F"])
def test_every_decoded_mode_traces(tiny_dinov2, mode):
    """open_image's output of any odd upload goes straight into Model.trace (issue item 1)."""
    fmt = {"CMYK": "JPEG", "F": "TIFF"}.get(mode, "PNG")
    values = np.random.default_rng(1).integers(0, 255, (21, 34)).astype(np.uint8)
    source = Image.fromarray(values).convert(mode if mode not in ("I;16", "F") else "L")
    if mode == "I;16":
        source = Image.fromarray(values.astype(np.uint16) * 257)
    elif mode == "F":
        source = Image.fromarray(values.astype(np.float32) / 255)
    buffer = io.BytesIO()
    source.save(buffer, fmt)
    photo = attnviz.open_image(buffer.getvalue())
    assert photo.mode == "RGB" and photo.size == (34, 21)
    tr = tiny_dinov2.trace(photo, image_size=112)
    assert vision.cls_maps(tr).shape == (2, 4, 16, 16)


# --- CJK labels in server-side exports -----------------------------------------
def test_cjk_labels_are_drawn_with_the_installed_cjk_font_not_empty_boxes():
    from attnviz.figures import render
    from matplotlib import font_manager

    path = render.cjk_font_file()
    assert path is not None and path.endswith("wqy-zenhei.ttc"), "make fonts installs fonts-wqy-zenhei"
    assert render.cjk_font_families(), "matplotlib must see the installed CJK font"
    found = font_manager.findfont(font_manager.FontProperties(family=list(render.cjk_font_families())))
    assert found == path
    # Empty boxes (tofu) are one glyph for every missing character: two different CJK labels then
    # render to the same pixels. Drawn with the CJK font, they differ.
    m = np.eye(2, dtype=np.float32)
    one, other = render.figure_png(m, ["猫", "狗"], ["猫", "狗"]), render.figure_png(m, ["鱼", "鸟"], ["鱼", "鸟"])
    assert np.asarray(Image.open(io.BytesIO(one))).tolist() != np.asarray(Image.open(io.BytesIO(other))).tolist()
    # PIL labels (overlay grids) too
    assert render.label_font(12, "猫").path == path
    draw = lambda text: np.asarray(render.grid_of_overlays(Image.new("RGB", (32, 32)), np.zeros((1, 2, 2)), [text], tile=32))
    assert not np.array_equal(draw("猫"), draw("狗"))


def test_exports_grey_the_masked_triangle_and_name_their_axes():
    from attnviz.base.exports import file_stem
    from attnviz.figures import render

    figure = render.static_heatmap(np.tril(np.ones((3, 3))), list("abc"), list("abc"), "t", "viridis", 60, causal=True)
    axes = figure.axes[0]
    assert axes.get_xlabel() == "key (attended to)" and axes.get_ylabel() == "query (attending)"
    data = axes.images[0].get_array()
    assert data.mask.tolist() == np.triu(np.ones((3, 3), bool), k=1).tolist()
    assert axes.images[0].cmap.get_bad().tolist() == list(matplotlib_colour(render.MASKED_GREY))
    assert file_stem("smollm2-135m", "The cat sat on the mat, because it was", "L3H2") == \
        "smollm2-135m_The-cat-sat-on-the-mat_L3H2"


def matplotlib_colour(name):
    from matplotlib.colors import to_rgba
    return to_rgba(name)
