"""An image cut into the patches DINOv2 gets, the padding mask of a real batch, sparse
attention patterns with their cost (analysis.patterns), and the Lab view that draws them."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz.analysis import input_and_masks
from attnviz.ui import lab_patterns
from attnviz.uploads.images import load_sample

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "5_Lab.py")
VIEW = "Patches, padding, sparse patterns"
PICKER = "model_choice:encoder/lm"


@pytest.fixture(scope="module")
def dinov2():
    return attnviz.load_model("dinov2")


@pytest.fixture(scope="module")
def minilm():
    return attnviz.load_model("minilm")


# ---------------------------------------------------------------- (a) patches
@pytest.mark.parametrize("size", [224, 112])
def test_patch_grid_is_the_models_token_sequence(dinov2, size):
    photo = load_sample("cat")                                     # 451 x 300: a centre crop happens
    pt = input_and_masks.patch_tokens(dinov2, photo, size)
    tr = dinov2.trace(photo, image_size=size, attentions=False, saliency=False)
    p = dinov2.cfg.patch_size
    assert p == 14 and pt.patch_size == p and pt.grid == tr.grid == (size // p, size // p)
    assert pt.n_patches == tr.n - tr.n_prefix and pt.tokens == tr.tokens and pt.n_tokens == tr.n
    assert pt.n_prefix == 1 + dinov2.cfg.n_registers and pt.d_model == dinov2.cfg.d_model == 384
    assert pt.crop == (75, 0, 300) and pt.photo_size == (451, 300)
    # the shown pixels are the model's input: the same tensor gives the same run, bit for bit
    again = dinov2.trace(pt.pixels, attentions=False, saliency=False)
    assert torch.equal(again.hidden, tr.hidden)
    px = dinov2.pixels(photo, size)
    gw = pt.grid[1]
    for i in (0, 1, gw, pt.n_patches - 1, 37 % pt.n_patches):
        r, c = divmod(i, gw)
        assert torch.equal(pt.patch(i), px[:, r * p:(r + 1) * p, c * p:(c + 1) * p])
        # the drawn thumbnail is that patch un-normalised
        mean = torch.tensor(dinov2.image_mean).view(3, 1, 1)
        std = torch.tensor(dinov2.image_std).view(3, 1, 1)
        want = ((pt.patch(i) * std + mean).clamp(0, 1) * 255).round().permute(1, 2, 0)
        assert torch.equal(torch.from_numpy(pt.patch_rgb(i)).float(), want)
    assert pt.embedding_diff < 1e-4                               # conv == one matmul per patch
    assert pt.patch_norm > 0 and pt.position_norm > 0


def test_patch_view_refuses_a_text_model(minilm):
    with pytest.raises(ValueError, match="not a vision model"):
        input_and_masks.patch_tokens(minilm, load_sample("cat"))


# ---------------------------------------------------------------- (b) padding
TEXTS = ["The cat sat.", "A much longer sentence about the dog that ran all the way home."]


def test_padding_gives_pad_keys_zero_weight_and_real_rows_unchanged(minilm):
    r = input_and_masks.padding(minilm, TEXTS, layer=1, head=3)
    assert r.lengths == [len(minilm.encode_text(t)[0]) for t in TEXTS] and r.width == max(r.lengths)
    assert r.lengths[0] < r.width and r.tokens[0][r.lengths[0]:] == ["[PAD]"] * (r.width - r.lengths[0])
    short = r.lengths[0]
    assert not r.allowed[0][:, short:].any() and r.allowed[0][:, :short].all()
    assert torch.equal(r.batched[0, :, short:], torch.zeros(r.width, r.width - short))  # exactly 0
    assert r.pad_weight == 0.0
    for b, n in enumerate(r.lengths):
        alone = minilm.trace(TEXTS[b], layers=[1]).attentions[0, 3]
        assert torch.allclose(r.batched[b, :n, :n], alone, atol=1e-6, rtol=0)
        assert torch.equal(r.alone[b], alone)
    assert r.row_diff < 1e-6 and r.layer_diff < 1e-5 and r.hidden_diff < 1e-5
    # without the mask the real tokens do look at the pads, and their rows move
    assert r.unmasked_pad_weight > 0.01 and r.unmasked_row_diff > 1e-3
    assert r.blocked_by_padding == short * (r.width - short)


def test_padding_on_a_causal_lm():
    lm = attnviz.load_model("smollm2")
    r = input_and_masks.padding(lm, TEXTS, layer=2, head=1)
    assert r.causal and r.pad_weight == 0.0 and r.row_diff < 1e-6 and r.hidden_diff < 1e-4
    assert r.blocked_by_padding == 0       # right-padded: the causal mask already hides the pads


def test_padding_refusals(minilm):
    with pytest.raises(ValueError, match="two sentences"):
        input_and_masks.padding(minilm, ["one", "  "])
    with pytest.raises(ValueError, match="layer must lie"):
        input_and_masks.padding(minilm, TEXTS, layer=6)
    with pytest.raises(ValueError, match="cannot pad a batch"):
        input_and_masks.padding(attnviz.load_model("toy-copy"), ["0123", "01"])


# ---------------------------------------------------------------- (c) sparse patterns
def brute(kind, n, width, causal):
    def ok(i, j):
        if causal and j > i:
            return False
        return {"full": True, "local": abs(i - j) < width, "strided": (i - j) % width == 0,
                "block": i // width == j // width}[kind]
    return sum(ok(i, j) for i in range(n) for j in range(n))


@pytest.mark.parametrize("n,width", [(1, 1), (16, 4), (50, 7), (64, 64), (30, 100)])
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_mask_counts_are_exact(n, width, causal):
    for kind in input_and_masks.PATTERNS:
        mask = input_and_masks.pattern_mask(kind, n, width, causal)
        assert mask.shape == (n, n) and int(mask.sum()) == brute(kind, n, width, causal), kind
    w = min(width, n)   # closed forms, non-causal
    if not causal:
        assert int(input_and_masks.pattern_mask("local", n, width).sum()) == n + 2 * sum(n - d for d in range(1, w))
        blocks = [min(width, n - s) for s in range(0, n, width)]
        assert int(input_and_masks.pattern_mask("block", n, width).sum()) == sum(b * b for b in blocks)
        phases = [len(range(r, n, width)) for r in range(w)]
        assert int(input_and_masks.pattern_mask("strided", n, width).sum()) == sum(g * g for g in phases)


def test_pattern_cost_numbers():
    mask = input_and_masks.pattern_mask("block", 64, 16)
    c = input_and_masks.pattern_cost("block:16", mask, 32)
    assert c.scores == 4 * 16 * 16 and c.fraction == 0.25 and c.score_bytes == 4 * c.scores
    assert c.flops_qk == c.flops_av == 2 * c.scores * 32
    assert c.dense_scores == 64 * 64 and c.dense_bytes == 5 * 64 * 64
    assert input_and_masks.pattern_name("local", 8) == "local:8" and input_and_masks.pattern_name("full", 3) == "full"
    with pytest.raises(ValueError, match="unknown pattern"):
        input_and_masks.pattern_mask("dilated", 8, 2)


@pytest.mark.parametrize("causal", [False, True])
def test_skipping_kernels_equal_the_dense_kernel_with_the_mask(causal):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 100, 16, generator=g) for _ in range(3))
    # widths that do not divide n (one call per block or phase) and that do (one batched call)
    for kind, width in (("full", 1), ("local", 9), ("strided", 7), ("block", 13), ("strided", 10),
                        ("block", 20), ("block", 100), ("strided", 1)):
        mask = input_and_masks.pattern_mask(kind, 100, width, causal)
        dense = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert torch.allclose(input_and_masks.sliced_attention(kind, q, k, v, width, causal), dense, atol=1e-5), \
            (kind, width)
    rows = input_and_masks.measure_patterns(list(input_and_masks.PATTERNS), 64, {"local": 8, "strided": 4, "block": 16},
                                     16, causal, repeats=1)
    assert [r.name for r in rows] == ["full", "local:8", "strided:4", "block:16"]
    assert all(r.max_diff < 1e-5 and r.dense_ms > 0 and r.sliced_ms > 0 for r in rows)


def test_measured_caption_says_what_the_numbers_say():
    rows = [input_and_masks.Measured("full", 10.0, 5.0, 0.0), input_and_masks.Measured("local:8", 10.5, 20.0, 1e-7),
            input_and_masks.Measured("block:16", 11.0, 1.0, 0.0)]
    text = lab_patterns.measured_caption(rows)
    assert "10–11 ms" in text and "about the same for every pattern" in text
    assert "local:8 0.53× (slower)" in text and "block:16 11.00× (faster)" in text
    spread = lab_patterns.measured_caption([input_and_masks.Measured("full", 10.0, 10.2, 0.0),
                                            input_and_masks.Measured("block:16", 3.0, 1.0, 0.0)])
    assert "wider than 20 %" in spread and "full 0.98× (about as fast)" in spread


# ---------------------------------------------------------------- the Lab view
def lab_view() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=300).run()
    assert not at.exception, at.exception
    assert VIEW in at.radio(key="lab.view").options
    at.radio(key="lab.view").set_value(VIEW).run()
    assert not at.exception, at.exception
    return at


def section(at, name):
    at.radio(key="lab.patterns.view").set_value(name).run()
    assert not at.exception, at.exception
    return at


def metrics(at) -> dict:
    return {m.label: m.value for m in at.metric}


def test_lab_view_patches_section():
    at = lab_view()
    assert at.radio(key="lab.patterns.view").value == "Image → patches → tokens"
    text = " ".join(m.value for m in at.markdown)
    assert "256 patches → 257 tokens" in text and "d_model = 384" in text and "14×14-pixel patches" in text
    assert "37×37 grid" in text and "300×300" in text
    m = metrics(at)
    assert m["Patches"] == "16×16 = 256" and m["Tokens"] == "257" and m["d_model"] == "384"
    assert len(at.get("image")) >= 3                  # the photo, the grid, the token strip
    at.select_slider(key="lab.pat_size").set_value(112).run()
    assert not at.exception and metrics(at)["Tokens"] == "65"


def test_lab_view_padding_section_on_minilm_and_smollm2():
    at = section(lab_view(), "Padding mask")
    m = metrics(at)
    assert m["Pad-key weight, masked"] == "0"
    assert float(m["Real rows vs alone"]) < 1e-5
    assert float(m["Pad-key weight, no mask"]) > 0.01
    assert "exactly 0 weight" in " ".join(s.value for s in at.success)
    assert len(at.get("plotly_chart")) == 1 + 3 * 2   # the batch, then mask / batched / alone per sentence
    at.text_input(key="lab.pad_text1").input("").run()
    assert not at.exception and "two sentences" in " ".join(e.value for e in at.error)
    at.text_input(key="lab.pad_text1").input("Dogs bark at night.").run()
    at.number_input(key="lab.pad_head").set_value(11).run()
    at.selectbox(key=PICKER).select("smollm2").run()   # 9 heads: head 11 is clamped
    assert not at.exception, at.exception
    assert at.session_state["lab.pad_head"] == 8
    assert "already hides them" in " ".join(i.value for i in at.info)
    assert metrics(at)["Pad-key weight, masked"] == "0"


def test_lab_view_sparse_section_counts_and_measures():
    at = section(lab_view(), "Sparse patterns")
    at.select_slider(key="lab.sp_n").set_value(128).run()
    at.slider(key="lab.sp_w").set_value(5).run()
    at.slider(key="lab.sp_b").set_value(32).run()
    assert not at.exception
    costs = next(d.value for d in at.dataframe if "scores computed" in d.value.columns)
    assert list(costs["pattern"]) == ["full", "local:5", "strided:8", "block:32"]
    want = [int(input_and_masks.pattern_mask(k, 128, w).sum()) for k, w in
            (("full", 1), ("local", 5), ("strided", 8), ("block", 32))]
    assert list(costs["scores computed"]) == want and want[0] == 128 * 128
    assert (costs["dense kernel + mask: scores"] == 128 * 128).all()
    assert list(costs["QKᵀ FLOPs"]) == [2 * c * 32 for c in want]     # MiniLM's d_head = 32
    assert len(at.get("image")) == 4
    at.button(key="lab.sp_go").click().run()
    assert not at.exception
    measured = next(d.value for d in at.dataframe if "dense + mask (ms)" in d.value.columns)
    assert len(measured) == 4 and all(float(x) < 1e-4 for x in measured["max |difference|"])
