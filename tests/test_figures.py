"""Figure builders and renderers: exact values in figures, exact pixels in images."""

import base64
import io
import json
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from attnviz.analysis.head_ranking import rank_heads
from attnviz.analysis.stats import ROLES, head_stats, token_flow
from attnviz.analysis import position_tables
from attnviz.figures import lab_figures
from attnviz.figures import render
from attnviz.figures import attention_figures
from attnviz.figures import head_figures
from attnviz.figures import latency_figures


def decode(value):
    """A plotly JSON array: a plain list, or the base64 typed array plotly 6+ writes."""
    if isinstance(value, dict) and "bdata" in value:
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        return array.reshape([int(s) for s in shape.split(",")]) if shape else array
    return np.asarray(value)


def as_json(figure):
    return json.loads(figure.to_json())


def random_attention(layers, heads, n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(layers, heads, n, n, generator=gen), -1)


TOKENS = ["[CLS]", "the", "cat", "saw", "the", "猫", "<|im_start|>", "the", "[SEP]"]


def test_head_heatmap_keeps_z_and_distinct_repeated_tokens():
    matrix = random_attention(1, 1, len(TOKENS))[0, 0]
    spec = as_json(attention_figures.head_heatmap(matrix, TOKENS, title="L0 H0"))
    trace = spec["data"][0]
    np.testing.assert_array_equal(decode(trace["z"]), matrix.numpy())   # bit for bit
    assert decode(trace["x"]).tolist() == list(range(len(TOKENS)))
    assert decode(trace["y"]).tolist() == list(range(len(TOKENS)))
    assert spec["layout"]["xaxis"]["ticktext"] == TOKENS             # "the" three times
    assert spec["layout"]["yaxis"]["ticktext"] == TOKENS
    assert spec["layout"]["yaxis"]["autorange"] == "reversed"        # query 0 at the top
    custom = trace["customdata"]
    assert custom[5][2] == ["猫", "cat"]                              # hover: query, key tokens
    assert "%{z" in trace["hovertemplate"]


def test_head_heatmap_causal_adds_a_mask_trace_and_thins_long_labels():
    n = 200
    tokens = [f"t{i}" for i in range(n)]
    matrix = torch.softmax(torch.randn(n, n).tril() + torch.triu(torch.full((n, n), -1e9), 1), -1)
    spec = as_json(attention_figures.head_heatmap(matrix, tokens, causal=True, max_ticks=50))
    np.testing.assert_array_equal(decode(spec["data"][0]["z"]), matrix.numpy())
    assert len(spec["data"]) == 2
    mask = spec["data"][1]                             # one grey polygon over exactly j > i
    xs, ys = decode(mask["x"]).astype(float), decode(mask["y"]).astype(float)
    area = 0.5 * abs(np.dot(xs, np.roll(ys, -1)) - np.dot(ys, np.roll(xs, -1)))
    assert mask["fill"] == "toself" and area == n * (n - 1) / 2
    assert xs.min() == 0.5 and xs.max() == n - 0.5 and ys.min() == -0.5 and ys.max() == n - 1.5
    ticks = spec["layout"]["xaxis"]["tickvals"]
    assert len(ticks) <= 50 and ticks[:2] == [0, 4]
    assert spec["layout"]["xaxis"]["ticktext"][1] == "t4"
    with pytest.raises(ValueError, match="does not match"):
        attention_figures.head_heatmap(matrix, tokens[:-1])


def test_token_labels_escape_plotly_markup_and_show_blanks():
    assert attention_figures.token_label("<s>") == "&lt;s&gt;"          # would otherwise be a strikethrough
    assert attention_figures.token_label("</s>") == "&lt;/s&gt;"
    assert attention_figures.token_label("<|im_end|>") == "<|im_end|>"
    assert attention_figures.token_label(" ") == "␣"   # core.tokens.WHITESPACE_SYMBOLS, as in token labels
    assert attention_figures.token_label("\n\n") == "↵↵"
    assert attention_figures.token_label("\u200b") == "<U+200B>"
    assert attention_figures.token_label("") == "∅"
    assert attention_figures.token_label("😀שלום") == "😀שלום"
    assert attention_figures.token_label("x" * 40).endswith("…") and len(attention_figures.token_label("x" * 40)) == 24


@pytest.mark.parametrize("layers, heads", [(30, 9), (6, 12)])   # SmolLM2, MiniLM
def test_overview_image_tiles_every_head(layers, heads):
    n = 10
    image = render.overview_image(random_attention(layers, heads, n), max_cell=64, gap=2)
    pooled, upscale = render.overview_geometry(n, 64)
    cell = pooled * upscale                                   # 10 tokens -> 4x -> 40 px
    assert cell == 40
    assert image.dtype == np.uint8
    assert image.shape == (layers * (cell + 2) - 2, heads * (cell + 2) - 2, 3)


def test_overview_cells_land_where_expected_and_long_inputs_are_pooled():
    n = 8
    attn = torch.full((2, 3, n, n), 1.0 / n)
    attn[1, 2] = torch.eye(n)                                  # layer 1, head 2: identity
    image = render.overview_image(attn, gap=2, min_cell=8)        # upscale 1: one pixel per entry
    pitch = n + 2
    cell = image[pitch: pitch + n, 2 * pitch: 2 * pitch + n]
    lut = render.colour_lut("viridis")
    assert (cell[np.arange(n), np.arange(n)] == lut[255]).all()
    assert (cell[0, 1] == lut[0]).all()
    assert (image[n:n + 2, :] == 255).all()                   # the gap row is background
    big = render.overview_image(random_attention(1, 2, 300), max_cell=64)
    assert big.shape[0] == 60                                  # 300 tokens pooled by 5 to 60


def test_overview_survives_nan():
    attn = random_attention(2, 2, 6)
    broken = attn.clone()
    broken[0, 1, 2, 3] = float("nan")
    image = render.overview_image(broken)
    cleaned = broken.nan_to_num(0.0)
    np.testing.assert_array_equal(image, render.overview_image(cleaned))


def test_overview_figure_labels_layers_and_heads():
    layers, heads = 30, 9
    spec = as_json(attention_figures.overview_figure(random_attention(layers, heads, 12), selected=(3, 4),
                                       off=torch.zeros(layers, heads, dtype=torch.bool)))
    image_trace, hover_trace = spec["data"]
    assert image_trace["type"] == "image" and image_trace["source"].startswith("data:image/png")
    png = Image.open(io.BytesIO(base64.b64decode(image_trace["source"].split(",", 1)[1])))
    assert png.size[1] > png.size[0]                          # 30 layers tall, 9 heads wide
    assert spec["layout"]["yaxis"]["ticktext"] == [str(i) for i in range(layers)]
    assert spec["layout"]["xaxis"]["ticktext"] == [str(i) for i in range(heads)]
    custom = hover_trace["customdata"]
    assert custom[3][4][:2] == [3, 4]                          # hover / selection: layer, head
    x_centres = decode(hover_trace["x"])
    assert x_centres[0] == pytest.approx((png.size[0] - (heads - 1) * 2) / heads / 2 - 0.5)
    assert len(spec["layout"]["shapes"]) == 1


def test_overlay_colours_exactly_one_patch():
    patch, grid = 8, (4, 5)
    image = Image.new("RGB", (grid[1] * patch, grid[0] * patch), (128, 128, 128))
    patch_map = np.zeros(grid)
    patch_map[1, 3] = 1.0
    out = np.asarray(render.overlay_patch_map(image, patch_map, alpha=0.6))
    assert out.shape == (32, 40, 3)
    hot = np.zeros(out.shape[:2], dtype=bool)
    hot[8:16, 24:32] = True
    hot_colours = np.unique(out[hot].reshape(-1, 3), axis=0)
    cold_colours = np.unique(out[~hot].reshape(-1, 3), axis=0)
    assert len(hot_colours) == 1 and len(cold_colours) == 1
    assert not np.array_equal(hot_colours, cold_colours)
    expected_hot = np.rint(0.4 * 128 + 0.6 * render.colour_lut("inferno")[255].astype(float))
    np.testing.assert_array_equal(hot_colours[0], expected_hot)


def test_overlay_scales_to_a_larger_image():
    image = Image.new("RGB", (100, 60), (0, 0, 0))             # grid 3 x 4 -> 20 x 25 px cells
    patch_map = np.zeros((3, 4))
    patch_map[2, 0] = 5.0
    out = np.asarray(render.overlay_patch_map(image, patch_map, alpha=1.0))
    lut = render.colour_lut("inferno")
    assert (out[40:60, 0:25] == lut[255]).all()
    assert (out[:40] == lut[0]).all() and (out[:, 25:] == lut[0]).all()


def test_grid_of_overlays_tiles_and_checks_labels():
    image = Image.new("RGB", (64, 32), (200, 200, 200))
    maps = torch.rand(5, 2, 4)
    grid = render.grid_of_overlays(image, maps, [f"H{i}" for i in range(5)], columns=3, tile=64)
    assert grid.size == (3 * 64 + 2 * 4, 2 * (32 + 18) + 4)
    with pytest.raises(ValueError, match="labels"):
        render.grid_of_overlays(image, maps, ["only one"])


def test_exports_have_the_right_magic_and_no_glyph_warnings():
    matrix = random_attention(1, 1, len(TOKENS))[0, 0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        png = render.figure_png(matrix, TOKENS, TOKENS, title="$price$ 猫")
        svg = render.figure_svg(matrix, TOKENS, TOKENS, title="head 0")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert svg.lstrip().startswith(b"<?xml") and b"<svg" in svg[:2000]
    assert "猫".encode() in svg                                # text kept as text in SVG
    assert not [w for w in caught if "Glyph" in str(w.message)]
    rgb = render.overview_image(random_attention(2, 2, 5))
    png_overview = render.image_png(rgb)
    assert png_overview.startswith(b"\x89PNG")
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png_overview))), rgb)


def test_lines_figure_draws_each_weight_above_threshold_once():
    attn_layer = random_attention(1, 3, 6, seed=4)[0]
    figure = attention_figures.lines_figure(attn_layer, TOKENS[:6], heads=[0, 2], threshold=0.2)
    spec = as_json(figure)
    line_traces = [t for t in spec["data"]
                   if t.get("mode") == "lines" and t.get("hoverinfo") == "skip"]
    drawn = sum(int(np.isnan(decode(t["x"]).astype(float)).sum()) for t in line_traces)
    assert drawn == int((attn_layer[[0, 2]] >= 0.2).sum())
    one_query = as_json(attention_figures.lines_figure(attn_layer, TOKENS[:6], heads=[1], query=2, threshold=0))
    ys = np.concatenate([decode(t["y"]).astype(float) for t in one_query["data"]
                         if t.get("hoverinfo") == "skip"])
    assert set(ys[0::3]) == {2.0}                             # every line starts at query 2
    with pytest.raises(ValueError, match="heads"):
        attention_figures.lines_figure(attn_layer, TOKENS[:6], heads=[3])


def test_role_map_uses_the_stats_roles():
    patterns = torch.stack([torch.eye(6), torch.ones(6, 6) / 6])[None].expand(2, 2, 6, 6)
    stats = head_stats(patterns)
    spec = as_json(attention_figures.role_map_figure(stats))
    z = decode(spec["data"][0]["z"])
    assert z.shape == (2, 2)
    assert z[0, 0] == ROLES.index("self") and z[1, 1] == ROLES.index("broad")
    stat_spec = as_json(attention_figures.stat_map_figure(stats, "norm_entropy"))
    assert decode(stat_spec["data"][0]["z"])[0, 1] == pytest.approx(1.0, abs=1e-6)


def test_bar_topk_keeps_order_and_duplicates():
    spec = as_json(attention_figures.bar_topk([" Paris", " the", " the"], [0.7, 0.2, 0.1]))
    assert decode(spec["data"][0]["x"]).tolist() == pytest.approx([0.7, 0.2, 0.1])
    assert spec["layout"]["yaxis"]["ticktext"] == [" Paris", " the", " the"]
    assert spec["layout"]["yaxis"]["autorange"] == "reversed"


def test_distance_and_flow_figures_carry_the_values():
    distances = torch.arange(6.0).reshape(3, 2)
    spec = as_json(attention_figures.distance_figure(distances))
    assert decode(spec["data"][1]["y"]).tolist() == [1.0, 3.0, 5.0]
    flow = token_flow(random_attention(3, 2, 4), 1)
    flow_spec = as_json(attention_figures.token_flow_figure(flow, ["a", "b", "a", "c"]))
    np.testing.assert_array_equal(decode(flow_spec["data"][0]["z"]), flow.numpy())


def test_lines_figure_title_names_the_layer_and_heads():
    attn_layer = random_attention(1, 3, 6, seed=5)[0]
    assert attention_figures.lines_title(4, [2]) == "Layer 4, head 2"
    assert attention_figures.lines_title(4, [2, 0]) == "Layer 4, heads 2, 0"
    spec = as_json(attention_figures.lines_figure(attn_layer, TOKENS[:6], [2, 0], title=attention_figures.lines_title(4, [2, 0])))
    assert spec["layout"]["title"]["text"] == "Layer 4, heads 2, 0"
    legend = [t["name"] for t in spec["data"] if t.get("showlegend") is not False and "name" in t]
    assert legend == ["head 2", "head 0"]


def test_head_rank_figure_shows_the_strongest_heads_first():
    attn = random_attention(3, 4, 5, seed=6)
    ranking = rank_heads(attn, 3, 1)
    spec = as_json(attention_figures.head_rank_figure(ranking, top=5))
    bars = spec["data"][0]
    np.testing.assert_allclose(decode(bars["x"]).astype(float), ranking["weight"][:5])
    assert spec["layout"]["yaxis"]["ticktext"][0] == f"L{ranking.loc[0, 'layer']} H{ranking.loc[0, 'head']}"
    assert decode(bars["customdata"])[0].tolist() == [ranking.loc[0, "layer"], ranking.loc[0, "head"]]
    others = spec["data"][1]         # the other words' mean weight beside each head's bar
    np.testing.assert_allclose(decode(others["x"]).astype(float), ranking["others"][:5])


def _png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(b"\x89PNG")
    return Image.open(io.BytesIO(data)).size


@pytest.mark.parametrize("layers, heads, n", [(30, 9, 14), (6, 12, 16), (2, 4, 5)])
def test_overview_png_is_labelled_readable_and_bounded(layers, heads, n):
    attn = random_attention(layers, heads, n, seed=7)
    raw = render.overview_image(attn)
    figure = render.overview_export_figure(attn, title="minilm: 6 layers × 12 heads")
    axes = figure.axes[0]
    assert [t.get_text() for t in axes.get_xticklabels()] == [str(h) for h in range(heads)]
    assert [t.get_text() for t in axes.get_yticklabels()] == [str(la) for la in range(layers)]
    assert axes.get_xlabel() == "head" and axes.get_ylabel() == "layer"
    assert "minilm: 6 layers × 12 heads" in [t.get_text() for t in figure.texts]
    width, height = _png_size(render.overview_png(attn, title="t"))
    # Readable: the tiles are never shrunk and the longer side reaches the export minimum.
    assert width >= raw.shape[1] and height >= raw.shape[0]
    assert max(width, height) >= render.OVERVIEW_EXPORT_MIN_SIDE
    assert width * height <= render.LIMITS.max_render_pixels


def test_overview_png_stays_within_a_pixel_budget():
    attn = random_attention(24, 16, 64, seed=8)                    # 24 x 16 tiles of 64 px
    raw = render.overview_image(attn)
    budget = 1_000_000
    width, height = _png_size(render.overview_png(attn, max_pixels=budget))
    assert width * height <= budget < raw.shape[0] * raw.shape[1] * 1.2
    figure = render.overview_export_figure(attn, max_pixels=budget)
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels[0] == "0" and len(labels) <= 24                  # thinned when tiles are small


def test_overview_figure_fits_its_tiles_and_has_a_colour_bar():
    """30 x 9 left a wide empty band beside the grid and had no colour scale."""
    layers, heads = 30, 9
    figure = attention_figures.overview_figure(random_attention(layers, heads, 12))
    spec = as_json(figure)
    png = Image.open(io.BytesIO(base64.b64decode(spec["data"][0]["source"].split(",", 1)[1])))
    layout = spec["layout"]
    plot_height = layout["height"] - layout["margin"]["t"] - layout["margin"]["b"]
    image_width = plot_height * png.size[0] / png.size[1]
    assert layout["width"] - layout["margin"]["l"] - layout["margin"]["r"] <= image_width + 120
    hover = spec["data"][1]
    assert hover["showscale"] and hover["zmin"] == 0 and hover["zmax"] == 1
    assert "largest weight" in hover["colorbar"]["title"]["text"]
    assert np.isnan(decode(hover["z"]).astype(float)).all()      # nothing painted over the image


def test_one_signed_matrix_scale_runs_to_zero_not_past_it():
    """ALiBi's biases are all <= 0 but the scale ran to +25."""
    alibi = position_tables.alibi_table(32, 8)[0]
    trace = as_json(lab_figures.matrix_figure(alibi))["data"][0]
    assert trace["zmax"] == 0 and trace["zmin"] < 0


# ---------------------------------------------------------------- the encoder difference map
def test_difference_map_of_no_change_says_so_instead_of_a_micro_scale():
    """No head off (or none reaching this head): every Δ is exactly 0. It showed a ±1µ colour bar."""
    same = random_attention(1, 1, 5)[0, 0]
    for causal in (False, True):
        spec = as_json(head_figures.difference_heatmap(same, same.clone(), list("abcde"), causal=causal))
        trace = spec["data"][0]
        z = decode(trace["z"]).astype(float)
        assert np.nanmax(np.abs(z)) == 0 and trace["zmid"] == 0
        assert trace["showscale"] is False                        # no scale of ±0 to misread
        assert trace["zmin"] == -trace["zmax"] and trace["zmax"] >= 1e-3  # 0 sits in the white middle
        notes = [a["text"] for a in spec["layout"].get("annotations", [])]
        assert notes == [head_figures.NO_DIFFERENCE] and "no difference" in notes[0]


@pytest.mark.parametrize("size,top_text", [(3e-7, "3.0×10⁻⁷"), (0.25, "0.25"), (0.0012, "0.0012")])
def test_difference_map_scale_says_its_magnitude_in_plain_numbers(size, top_text):
    before = torch.full((4, 4), 0.25)
    after = before.clone()
    after[1, 2] += size
    after[3, 0] -= size / 2
    trace = as_json(head_figures.difference_heatmap(before, after, list("abcd")))["data"][0]
    top = float(np.float32(0.25 + size) - np.float32(0.25))     # what float32 holds of the change
    assert trace["showscale"] is not False and trace["zmax"] == pytest.approx(top) and trace["zmin"] == -trace["zmax"]
    bar = trace["colorbar"]
    assert bar["tickvals"] == pytest.approx([-top, -top / 2, 0, top / 2, top])
    assert bar["ticktext"][2] == "0" and bar["ticktext"][-1] == head_figures.plain_number(top)
    assert head_figures.plain_number(size) == top_text and bar["ticktext"][0].startswith("-")
    assert not any("µ" in t or "e-" in t for t in bar["ticktext"])
    assert "Δ weight %{z:.3g}" in trace["hovertemplate"]          # tiny changes do not hover as 0.0000


# ---------------------------------------------------------------- latency legends
def latency_rows(backend, measured, threads=4, scale=1.0, model="minilm"):
    ns = np.array([16, 32, 64])
    ms = scale * (1 + ns / 10)
    return pd.DataFrame(dict(model=model, variant="fused", n_heads=12, threads=threads, backend=backend,
                             engine="torch", dtype="fp32", measured=measured, seq_len=ns, median_ms=ms,
                             p10_ms=ms * 0.9, p90_ms=ms * 1.1, peak_mem_mb=2.0 + ns / 100 * (3 if measured else 1),
                             tokens_per_s=1000 * ns / ms, test=""))


def sweep_rows():
    return pd.concat([latency_rows("cpu", True, threads=2), latency_rows("pi4", False, scale=5),
                      latency_rows("pi5", False, scale=2)], ignore_index=True)


def test_memory_draws_devices_with_one_curve_as_one_named_line():
    """The memory model does not depend on the device, so pi4 was drawn exactly under pi5."""
    figure = latency_figures.memory_figure(sweep_rows())
    names = [t.name for t in figure.data]
    assert len(figure.data) == 2 and names == ["2 thr · cpu · measured", "4 thr · pi4 = pi5 · modelled"]
    assert "pi4 = pi5: memory does not depend on the device" in figure.layout.title.text
    assert list(figure.data[1].y) == list(latency_rows("pi4", False)["peak_mem_mb"])
    assert latency_figures.same_devices(sweep_rows()) == ["pi4 = pi5"]
    differ = sweep_rows()
    differ.loc[differ["backend"] == "pi5", "peak_mem_mb"] += 1      # curves that differ stay two lines
    assert len(latency_figures.memory_figure(differ).data) == 3 and latency_figures.same_devices(differ) == []
    assert "does not depend" not in latency_figures.memory_figure(differ).layout.title.text
    # latency does depend on the device: three lines, each named
    assert len(latency_figures.latency_figure(sweep_rows()).data) == 3


def test_every_latency_legend_names_measured_or_modelled():
    """Measured vs modelled was told by the dash style alone."""
    df = sweep_rows()
    kinds = ("measured", "modelled")
    for figure in (latency_figures.latency_figure(df), latency_figures.memory_figure(df), latency_figures.throughput_figure(df),
                   latency_figures.growth_figure(df)):
        lines = [t for t in figure.data if not str(t.name).startswith("slope")]
        assert lines and all(t.name.endswith(kinds) for t in lines), [t.name for t in lines]
        for t in lines:
            assert (t.line.dash == "solid") == t.name.endswith("measured")
    fit = latency_figures.fit_figure([16, 32, 64], [1.0, 2.0, 5.0], "minilm · pi5", measured=False)
    assert fit.data[0].name == "minilm · pi5 · modelled" and fit.data[1].name.startswith("fit: ")
    assert latency_figures.fit_figure([16, 32, 64], [1.0, 2.0, 5.0], "minilm · cpu").data[0].name.endswith("measured")
    device = latency_rows("pi4", True)
    twins = latency_rows("pi5", False, scale=0.5)
    overlay = latency_figures.overlay_figure(device, twins, "Measured on the device vs pi5")
    assert [t.name for t in overlay.data] == ["minilm · 4 thr · measured", "minilm · 4 thr · modelled (pi5)"]
    decode = pd.DataFrame(dict(model="smollm2", backend=["cpu", "cpu", "pi5", "pi5"], engine="torch", dtype="fp32",
                               threads=4, measured=[True, True, False, False], test="tg", depth=[0, 128] * 2,
                               tg_tps=[20.0, 18.0, 5.0, 4.0]))
    assert [t.name for t in latency_figures.decode_figure(decode).data] == [
        "smollm2 · cpu · torch · fp32 · 4 thr · measured", "smollm2 · pi5 · torch · fp32 · 4 thr · modelled"]


def test_overview_cells_are_what_the_figure_can_show():
    """A 30-layer overview is pooled to the ~42 px a cell gets in the tallest figure (finer pooling
    only costs PNG bytes the browser averages away); small models keep 64; never below 32."""
    from attnviz.figures import attention_figures
    assert attention_figures.overview_cells(30) == 42 and attention_figures.overview_cells(6) == 64 and attention_figures.overview_cells(200) == 32
    attn = torch.softmax(torch.randn(30, 9, 370, 370), -1)
    from attnviz.analysis.stats import downsample_attention
    figure = attention_figures.overview_figure(downsample_attention(attn, attention_figures.overview_cells(30)))
    assert figure.layout.height <= attention_figures.OVERVIEW_MAX_HEIGHT
    image_rows = 30 * (42 + 2) - 2 + 4       # 42-px cells, 2-px gaps (and the image's border)
    assert figure.data[1].y[-1] < image_rows


def test_token_axes_let_labels_overflow_instead_of_measuring_each():
    from attnviz.figures import attention_figures
    figure = attention_figures.head_heatmap(torch.softmax(torch.randn(80, 80), -1), [f"t{i}" for i in range(80)])
    assert figure.layout.xaxis.ticklabeloverflow == "allow" == figure.layout.yaxis.ticklabeloverflow
