"""Products over a weight's int8 grid (`attnviz.core.row_products`): found only where the weights
are whole multiples of one step, the float32 product up to float rounding, a float32 fallback
elsewhere; every decoder weight of the bundled translators is on its grid, and so is their output
layer, whose few-row products (the whole vocabulary's check) read it as float16 whole numbers."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnviz
from attnviz.core import row_products
from attnviz.core.blocks import Linear
from attnviz.core.row_products import HALF_ROWS, HalfGridProduct, RowProduct, grid_step, row_steps


def on_grid(out: int, n_in: int, step: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (out, n_in), generator=g).float()
    q[0, 0] = 1.0                                   # a trained int8 matrix holds a weight of one step
    return q * step


def test_the_kernel_is_there_and_gives_the_float32_product():
    assert row_products.kernel_works()


@pytest.mark.parametrize("shape", [(1536, 256), (256, 1536), (256, 256), (563, 256)])
def test_the_product_on_the_grid_is_the_float32_product(shape):
    w = on_grid(*shape, step=0.0073)
    b = torch.randn(shape[0])
    product = RowProduct(w, b)
    assert product.on_grid and product.nbytes() < w.numel() * 4 // 3   # a byte a weight (+ 8 a row)
    for seed in range(3):
        x = torch.randn(1, shape[1], generator=torch.Generator().manual_seed(seed)) * 5
        want = (x.double() @ w.double().t() + b.double()).float()
        got, float32 = product(x), F.linear(x, w, b)
        assert got.shape == (1, shape[0])
        # both within float rounding of the exact product (float32 itself is not exact)
        scale = float((x.abs().double() @ w.abs().double().t()).max())
        assert float((got - want).abs().max()) <= 1e-6 * scale
        assert float((float32 - want).abs().max()) <= 1e-6 * scale


def test_off_the_grid_the_product_is_float32():
    torch.manual_seed(0)
    w, b = torch.randn(64, 32), torch.randn(64)
    assert grid_step(w) is None
    product = RowProduct(w, b)
    x = torch.randn(1, 32)
    assert not product.on_grid and torch.allclose(product(x), F.linear(x, w, b), atol=1e-6)
    coarse = on_grid(64, 32, step=0.01)
    coarse[3, 4] = 0.015                            # one weight between two steps: not a grid
    assert grid_step(coarse) is None
    wide = on_grid(8, 32, step=0.01) * 300          # |q| up to 38,100: not int8
    wide[0, 0] = 0.01
    assert grid_step(wide) is None
    assert grid_step(torch.zeros(4, 4)) is None
    broken = on_grid(8, 8, step=0.01)
    broken[2, 2] = float("nan")
    assert grid_step(broken) is None


@pytest.mark.parametrize("key", ["en-pt", "pt-en"])
def test_every_decoder_weight_of_the_bundled_translators_is_on_its_grid(key):
    net = attnviz.load_model(key).net
    for block in net.decoder:
        products = [p for p in block.row_weights() if isinstance(p, RowProduct)]
        assert len(products) == 6 and all(p.on_grid for p in products)


def test_the_half_precision_kernel_is_there_and_gives_the_float32_product():
    assert row_products.half_kernel_works()


@pytest.mark.parametrize("rows", [1, 5, 12, HALF_ROWS])
def test_the_float16_grid_product_is_the_float32_product(rows):
    w = on_grid(3000, 256, step=0.0065)
    b = torch.randn(3000)
    product = HalfGridProduct.of(w, b)
    assert product is not None and product.nbytes() == w.numel() * 2 + 3000 * 4   # + a step a row
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)) * 5
    want = (x.double() @ w.double().t() + b.double()).float()
    got = product(x)
    scale = float((x.abs().double() @ w.abs().double().t()).max())
    assert got.shape == (rows, 3000) and float((got - want).abs().max()) <= 1e-6 * scale
    assert torch.equal(product(x[None])[0], got)                          # (B, T, in) as (T, in)
    assert HalfGridProduct.of(torch.randn(30, 20)) is None                 # no grid: no copy


def test_a_packed_output_layer_takes_the_float16_grid_for_few_rows_only():
    layer = Linear(256, 3000)
    with torch.no_grad():
        layer.weight.copy_(on_grid(3000, 256, step=0.0065))
    assert layer.pack(half=True) and layer._half is not None
    plain = Linear(256, 3000)
    plain.load_state_dict(layer.state_dict())
    calls = []
    real = layer._half
    layer._half = lambda x: calls.append(x.shape) or real(x)
    x = torch.randn(HALF_ROWS + 1, 256)
    with torch.inference_mode():
        for n in (1, HALF_ROWS, HALF_ROWS + 1):
            torch.testing.assert_close(layer(x[:n]), plain(x[:n]), atol=1e-4, rtol=1e-5)
    assert calls == [(1, 256), (HALF_ROWS, 256)]                          # more rows: oneDNN's float32
    with torch.no_grad():
        layer.weight.add_(1.0)                                            # changed in place: not used
    with torch.inference_mode():
        torch.testing.assert_close(layer(x[:2]), x[:2] @ layer.weight.t() + layer.bias)
    assert len(calls) == 2


def test_row_steps_find_stacked_grids_and_rows_without_a_one_step_weight():
    q, k, v = on_grid(64, 32, 0.002, seed=1), on_grid(64, 32, 0.0043, seed=2), on_grid(64, 32, 0.0051, seed=3)
    k[5] = torch.round(k[5] / 0.0086).clamp(-63, 63) * 0.0086   # even multiples only: its smallest is 2 steps
    k[5, 0] = 3 * 0.0043                              # ... and one odd multiple: only the block's step fits
    fused = torch.cat([q, k, v])
    steps = row_steps(fused)
    assert steps is not None
    torch.testing.assert_close(steps, torch.tensor([0.002] * 64 + [0.0043] * 64 + [0.0051] * 64))
    x = torch.randn(7, 32)
    want = x.double() @ fused.double().t()
    got = HalfGridProduct.of(fused)(x)
    assert float((got.double() - want).abs().max()) <= 1e-6 * float((x.abs() @ fused.abs().t()).max())
    assert row_steps(torch.randn(64, 32)) is None       # float32 weights: every row its own smallest
    off = fused.clone()
    off[70, 3] += 0.001                               # off its block's grid
    assert row_steps(off) is None
    zero_row = fused.clone()
    zero_row[10] = 0.0
    assert row_steps(zero_row) is not None
    broken = fused.clone()
    broken[3, 3] = float("nan")
    assert row_steps(broken) is None and HalfGridProduct.of(broken) is None


@pytest.mark.parametrize("key", ["en-pt", "pt-en"])
def test_the_bundled_translators_encoder_and_output_layer_are_read_from_their_float16_grids(key):
    from attnviz.ui import loaded_models
    model = attnviz.load_model(key)
    head = model.net.lm_head
    halves = [m for part in (model.net.encoder, head) for m in part.modules() if isinstance(m, Linear)]
    assert len(halves) == 4 * model.cfg.n_enc_layers + 1 and all(m._half is not None for m in halves)
    assert bool((head._half.steps == grid_step(head.weight)).all())            # one step: one int8 matrix
    hidden = torch.randn(12, head.weight.shape[1], generator=torch.Generator().manual_seed(1)) * 4
    with torch.inference_mode():
        got = head(hidden)
    want = hidden.double() @ head.weight.double().t() + head.bias.double()
    scale = float((hidden.abs().double() @ head.weight.abs().double().t()).max())
    assert float((got.double() - want).abs().max()) <= 1e-6 * scale
    tensors = [*model.net.parameters(), *model.net.buffers(),
               *(m._packed for m in model.net.modules() if getattr(m, "_packed", None) is not None)]
    held = sum(t.numel() * t.element_size() for t in tensors)
    copies = sum(2 * m.weight.numel() + 4 * m.weight.shape[0] for m in halves)   # float16 whole numbers, steps
    assert loaded_models.model_bytes(model) == held + copies
