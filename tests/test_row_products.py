"""One-row products over a weight's int8 grid (`attnviz.core.row_products`): found only where the
weights are whole multiples of one step, the float32 product up to float rounding, a float32
fallback elsewhere; every decoder weight of the bundled translators is on its grid."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnviz
from attnviz.core import row_products
from attnviz.core.row_products import RowProduct, grid_step


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
