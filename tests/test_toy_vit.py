"""The Lab's toy ViT: 2-D sinusoidal positions, the synthetic images, axial masks that really keep
attention to a row and then a column, counted attention FLOPs, a deterministic training that beats
chance, exact held-out counts, and the sentence read from them."""
import math

import numpy as np
import pytest
import torch

from attnviz.core.positional import sinusoidal, sinusoidal_2d
from attnviz.figures import vit_figures
from attnviz.toys import toy_vit

TINY = dict(steps=4, batch_size=8, d_model=16, n_heads=2)


def test_sinusoidal_2d_codes_the_row_in_one_half_and_the_column_in_the_other():
    pe = sinusoidal_2d(3, 5, 8)
    assert pe.shape == (15, 8)
    p = 1 * 5 + 2                                     # row 1, column 2
    assert pe[p, 0].item() == pytest.approx(math.sin(1))
    assert pe[p, 1].item() == pytest.approx(math.cos(1))
    assert pe[p, 2].item() == pytest.approx(math.sin(1 / 10000 ** (2 / 4)))
    assert pe[p, 4].item() == pytest.approx(math.sin(2))
    assert pe[p, 5].item() == pytest.approx(math.cos(2))
    assert torch.equal(pe[:, :4].reshape(3, 5, 4)[:, 0], sinusoidal(3, 4))   # rows, columns: 1-D tables
    assert torch.equal(pe[:, 4:].reshape(3, 5, 4)[0], sinusoidal(5, 4))
    assert len({tuple(row) for row in sinusoidal_2d(8, 8, 32).tolist()}) == 64   # one code per patch


@pytest.mark.parametrize("rows, cols, dim", [(8, 8, 30), (8, 8, 2), (0, 8, 32)])
def test_sinusoidal_2d_refuses_shapes_it_cannot_code(rows, cols, dim):
    with pytest.raises(ValueError):
        sinusoidal_2d(rows, cols, dim)


def test_the_images_are_seeded_and_their_classes_say_where_the_marks_are():
    a = toy_vit.draw(300, np.random.default_rng(5))
    b = toy_vit.draw(300, np.random.default_rng(5))
    assert np.array_equal(a.pixels, b.pixels) and np.array_equal(a.labels, b.labels)
    assert a.pixels.shape == (300, 32, 32) and toy_vit.patches(a.pixels).shape == (300, 64, 16)
    (r1, c1), (r2, c2) = a.marks[:, 0].T, a.marks[:, 1].T
    assert not np.any((r1 == r2) & (c1 == c2))                       # never the same patch
    assert np.array_equal(a.labels == toy_vit.SAME_ROW, r1 == r2)
    assert np.array_equal(a.labels == toy_vit.SAME_COLUMN, c1 == c2)
    assert set(a.labels.tolist()) == {0, 1, 2}
    held = toy_vit.held_out_set()
    assert len(held.labels) == 400 and np.array_equal(held.pixels, toy_vit.held_out_set().pixels)


def test_axial_masks_keep_each_layer_to_its_row_then_its_column():
    net = toy_vit.new_vit(toy_vit.VitSettings(attention="axial", d_model=16, n_heads=2))
    images = toy_vit.draw(2, np.random.default_rng(0))
    with torch.inference_mode():
        _, weights = net(toy_vit.patches(images.pixels), need_weights=True)
    row, col = toy_vit.axial_masks()
    assert row.sum(1).tolist() == [8] * 64 and col.sum(1).tolist() == [8] * 64
    assert torch.all(weights[0][..., ~row] == 0) and torch.all(weights[0][..., row] > 0)
    assert torch.all(weights[1][..., ~col] == 0) and torch.all(weights[1][..., col] > 0)
    maps = toy_vit.patch_maps(net, images.pixels[0], 2 * 8 + 5)      # row 2, column 5
    assert maps[0].sum() == pytest.approx(1) and np.count_nonzero(maps[0][2]) == 8
    assert np.count_nonzero(maps[0]) == 8 and np.count_nonzero(maps[1][:, 5]) == 8
    full = toy_vit.new_vit(toy_vit.VitSettings(attention="full", d_model=16, n_heads=2))
    assert all(np.count_nonzero(m) == 64 for m in toy_vit.patch_maps(full, images.pixels[0], 21))


def test_attention_flops_count_real_axial_attention():
    assert toy_vit.attention_flops("full", 2, 32) == 2 * 4 * 64 * 64 * 32 == 1_048_576
    assert toy_vit.attention_flops("axial", 2, 32) == 4 * 64 * (8 + 8) * 32 == 131_072


def test_training_is_deterministic_and_beats_chance():
    s = toy_vit.VitSettings(positions="sinusoidal 2-D", attention="axial", steps=60)
    a, b = toy_vit.train(s), toy_vit.train(s)
    assert a.losses == b.losses and (a.correct, a.total) == (b.correct, b.total)
    assert a.steps_done == 60 and not a.stopped_early and a.total == 400
    assert a.correct == 329 and a.accuracy > 1 / 3 + 0.1
    assert a.flops == 131_072 and a.computed_flops == 1_048_576


def test_a_stop_keeps_the_steps_done_and_says_so():
    steps = []
    res = toy_vit.train(toy_vit.VitSettings(**TINY), progress=lambda i, n, loss: steps.append(i),
                        should_stop=lambda: len(steps) >= 2)
    assert res.steps_done == 2 and res.stopped_early and steps == [1, 2]


@pytest.mark.parametrize("change", [dict(positions="rotary"), dict(attention="sparse"), dict(steps=0),
                                    dict(attention="axial", n_layers=3), dict(d_model=18, n_heads=3),
                                    dict(d_model=30, n_heads=5), dict(lr=0.5), dict(n_layers=9),
                                    dict(budget_s=1e6)])
def test_bad_options_are_refused(change):
    with pytest.raises(ValueError):
        toy_vit.train(toy_vit.VitSettings(**{**TINY, **change}))


def test_bad_inputs_are_refused():
    net = toy_vit.new_vit(toy_vit.VitSettings(d_model=16, n_heads=2))
    with pytest.raises(ValueError, match="patches"):
        net(torch.zeros(1, 63, 16))
    with pytest.raises(ValueError, match="patch must lie"):
        toy_vit.patch_maps(net, np.zeros((32, 32), np.float32), 64)
    with pytest.raises(ValueError):
        toy_vit.draw(0, np.random.default_rng(0))
    with pytest.raises(ValueError):
        toy_vit.attention_flops("sparse", 2, 32)


def result(positions, attention, correct, total=400, steps=0):
    return toy_vit.VitResult(None, toy_vit.VitSettings(positions=positions, attention=attention), [], 0.0, steps,
                             False, correct, total)


def test_the_sentence_is_read_from_the_counts():
    text = toy_vit.summary([result("learned", "full", 228), result("learned", "axial", 391),
                            result("sinusoidal 2-D", "full", 240), result("sinusoidal 2-D", "axial", 380)])
    assert ("With learned positions, axial attention reached 97.75 % (391/400) against full attention's "
            "57.00 % (228/400): it helped (+40.75 points), with 8× fewer attention FLOPs") in text
    assert "With full attention, 2-D sinusoidal positions (60.00 % (240/400)) beside learned ones " \
           "(57.00 % (228/400)) made no clear difference (+3.00 points" in text
    assert "With axial attention, 2-D sinusoidal positions (95.00 % (380/400)) beside learned ones " \
           "(97.75 % (391/400)) did not help (-2.75 points)" in text
    assert text.endswith("Chance is 33.3 % (3 classes, drawn uniformly).")
    one = toy_vit.summary([result("learned", "axial", 200)])
    assert one.startswith("learned, axial: 50.00 % (200/400) of the held-out images right.")


def test_the_figures_show_exact_counts_and_every_layer():
    acc = vit_figures.accuracy_figure(["learned, full", "learned, axial"], [228, 391], [400, 400], 1 / 3)
    assert list(acc.data[0].text) == ["57.00 % (228/400)", "97.75 % (391/400)"]
    flops = vit_figures.flops_figure(["a", "b"], [1_048_576, 131_072], [1_048_576, 1_048_576])
    assert [list(bar.y) for bar in flops.data] == [[1_048_576, 131_072], [1_048_576, 1_048_576]]
    maps = {"full": [np.full((8, 8), 1 / 64)] * 2, "axial": [np.eye(8)[2:3].repeat(8, 0).T / 8] * 2}
    fig = vit_figures.patch_attention_figure(np.zeros((32, 32)), maps, (2, 5))
    assert len(fig.data) == 1 + 2 * 2                                  # the image, then two layers each
    with pytest.raises(ValueError):
        vit_figures.accuracy_figure(["a"], [1, 2], [4, 4], 0.5)
    with pytest.raises(ValueError):
        vit_figures.patch_attention_figure(np.zeros((32, 32)), {}, (0, 0))


def test_runs_still_at_chance_have_not_learned_yet():
    """Before: "axial helped +64.75 points" while both full-attention runs were at chance after 150 steps."""
    text = toy_vit.summary([result("learned", "full", 135, steps=150), result("learned", "axial", 394, steps=150),
                            result("sinusoidal 2-D", "full", 131, steps=150),
                            result("sinusoidal 2-D", "axial", 390, steps=150)])
    assert "helped" not in text.split("With full attention")[0]
    assert ("With learned positions, full attention (33.75 % (135/400)) has not learned yet after 150 steps "
            "(at chance): train longer before comparing full and axial attention.") in text
    assert "With full attention, 2-D sinusoidal positions" not in text      # both at chance: nothing to compare
    assert "With axial attention, 2-D sinusoidal positions" in text
