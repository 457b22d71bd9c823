"""Products x @ W^T + b read from a weight's int8 grid when the weight lies on one: one row at a
time for greedy decoding's one-row path (`RowProduct`), and a few rows at a time for the encoder
and the output layer over the whole vocabulary (`HalfGridProduct`).

The Bergamot students ship int8 matrices with one float scale each (weight = int8 / scale), so
every weight of their decoders is a whole multiple, -127..127, of one step. Stored as those bytes
(one per weight rather than four), a one-row product reads a quarter of the memory; decoding one
token at a time is bound by reading the weights, so it runs at about half the time. The product
is torch's own 8-bit row-wise embedding-bag kernel (fbgemm): a sum of the byte rows weighted by
x, each row dequantized as step * (q + 128) - 128 * step, accumulated in float32 -- the same
numbers as the float32 product up to float rounding (the rows are summed in another order). A
weight that is not on such a grid, or a build of torch whose kernel is missing or does not give
the float32 product on a probe, gets the float32 product.

A few rows (a sentence through the encoder, the whole vocabulary's check after a greedy decoding,
a beam) multiply better as float16: the grid's whole numbers q (|q| <= 127) are exact in float16,
fbgemm's half-precision-weight product converts them back and sums in float32, and the step
scales the sums -- again the float32 product up to rounding, from half the bytes (32,000 x 256:
2.2 ms against oneDNN's 2.9 ms for 12 rows on one core; in a translation, where the encoder's and
the output's weights no longer sit in the cache, the gain is larger). From about 24 rows on,
oneDNN's float32 product is the faster one.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

GRID_LEVELS = 127        # |q| <= 127: int8 values, stored offset by 128 as unsigned bytes
GRID_TOLERANCE = 1e-6    # |w - q * step| <= this x max|w|: float rounding of int8 / scale
PROBE_TOLERANCE = 1e-5   # the probe's product within this x its size of the float32 product
HALF_ROWS = 24           # up to this many rows the float16 grid product beats oneDNN's float32 one
MAX_STEPS = 8            # distinct row steps a stacked grid matrix may have


def _magnitudes(weight: torch.Tensor):
    """(weight as float32, |weight|, max |weight|), or None for an empty, all-zero or non-finite
    weight (no grid)."""
    w = weight.detach().float()
    if w.dim() != 2 or w.numel() == 0:
        return None
    mags = w.abs()
    top = float(mags.max())
    return None if not math.isfinite(top) or top == 0.0 else (w, mags, top)


def _fits(rows: torch.Tensor, step: float, top: float) -> torch.Tensor:
    """Per row: whether it is whole multiples -127..127 of `step`, up to float rounding."""
    q = torch.round(rows / step)
    return (q.abs().amax(1) <= GRID_LEVELS) & ((rows - q * step).abs().amax(1) <= GRID_TOLERANCE * top)


def grid_step(weight: torch.Tensor) -> float | None:
    """The step s with weight == q * s for whole q in -127..127 (up to float rounding), or None.
    The smallest nonzero magnitude is the step when some weight is +-1 step (every int8 matrix
    of a trained model has one); any other grid is not detected, and falls back to float32."""
    found = _magnitudes(weight)
    if found is None:
        return None
    w, mags, top = found
    step = float(mags[mags > 0].min())
    return step if bool(_fits(w, step, top).all()) else None


def _byte_rows(weight: torch.Tensor, step: float) -> torch.Tensor:
    """(out, in) weight -> the kernel's row-wise layout of W^T: (in, out + 8) bytes, each row the
    offset int8 values then its float32 scale (step) and bias (-128 step)."""
    q = torch.round(weight.detach().float() / step).t()
    rows = (q + 128).to(torch.uint8)
    scale_bias = torch.tensor([step, -128.0 * step], dtype=torch.float32).repeat(rows.shape[0], 1)
    return torch.cat([rows, scale_bias.view(torch.uint8)], dim=1)    # contiguous, as the kernel reads it


def _byte_bag():
    try:
        return torch.ops.quantized.embedding_bag_byte_rowwise_offsets.default
    except (AttributeError, RuntimeError):
        return None


# its arguments: rows, indices, offsets, scale_grad_by_freq, mode (0: sum), pruned, per-row weights,
# compressed indices, include_last_offset
_BYTE_BAG = _byte_bag()


@functools.cache
def kernel_works() -> bool:
    """Whether this build of torch has the byte kernel, vectorised (fbgemm), and it gives the float32
    product (probed once per process on a small grid matrix; a machine without it gets the float32
    products)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return False   # without fbgemm (ARM builds) it is not the kernel measured here: keep float32
    g = torch.Generator().manual_seed(0)
    weight = torch.randint(-GRID_LEVELS, GRID_LEVELS + 1, (24, 40), generator=g).float() * 0.01
    x = torch.randn(1, 40, generator=g)
    try:
        got = _BYTE_BAG(_byte_rows(weight, 0.01), torch.arange(40), torch.zeros(1, dtype=torch.long), False, 0,
                        False, x[0], None, False)
    except (RuntimeError, NotImplementedError, AttributeError, TypeError):
        return False
    want = x @ weight.t()
    return got.shape == want.shape and float((got - want).abs().max()) <= PROBE_TOLERANCE * float(want.abs().max())


class RowProduct:
    """x (1, in) -> x @ W^T + b (1, out), for one weight (out, in) and bias (out,) or None: over
    the weight's int8 grid when it has one (`on_grid`), else float32. A derived, read-only copy: the
    weight itself is never touched."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.bias = None if bias is None else bias.detach()
        self.rows = None
        if kernel_works():
            step = grid_step(weight)
            if step is not None:
                self.rows = _byte_rows(weight, step)
                self.indices = torch.arange(self.rows.shape[0])
                self.offsets = torch.zeros(1, dtype=torch.long)
        if self.rows is None:
            w = weight.detach()
            # for one row, x @ W read row by row from (in, out) is the faster float32 product on x86,
            # except for a matrix much wider in than out (the MLP's second projection), faster as (out, in)
            self.wide_in = w.shape[1] > 2 * w.shape[0]
            self.weight = w.contiguous() if self.wide_in else w.t().contiguous()

    @property
    def on_grid(self) -> bool:
        return self.rows is not None

    def nbytes(self) -> int:
        held = self.rows if self.rows is not None else self.weight
        return held.numel() * held.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.rows is not None:
            out = _BYTE_BAG(self.rows, self.indices, self.offsets, False, 0, False, x[0], None, False)
            return out if self.bias is None else out.add_(self.bias)
        if self.wide_in:
            return F.linear(x, self.weight, self.bias)
        return torch.mm(x, self.weight) if self.bias is None else torch.addmm(self.bias, x, self.weight)


@functools.cache
def half_kernel_works() -> bool:
    """Whether fbgemm's half-precision-weight product is in this build and gives the float32
    product of a small grid matrix's whole numbers (probed once per process)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return False
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-GRID_LEVELS, GRID_LEVELS + 1, (24, 40), generator=g).float()
    x = torch.randn(3, 40, generator=g)
    try:
        got = torch.ops.quantized.linear_dynamic_fp16(x, torch.ops.quantized.linear_prepack_fp16(q, None))
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
    want = x @ q.t()
    return got.shape == want.shape and float((got - want).abs().max()) <= PROBE_TOLERANCE * float(want.abs().max())


def row_steps(weight: torch.Tensor) -> torch.Tensor | None:
    """Each output row's step (out,) with weight[r] == q * steps[r] for whole q in -127..127 (up to
    float rounding), or None: one step for an int8 matrix, one per block of rows for matrices
    stacked from several (a fused Q/K/V projection). The step of the rows left is the smallest
    magnitude among them (a weight of one step, which an int8 matrix holds); every row that is
    whole multiples of it takes it. A weight needing more than MAX_STEPS steps, or with a row off
    every one (float32 weights), has no grid."""
    found = _magnitudes(weight)
    if found is None:
        return None
    w, mags, top = found
    smallest = torch.where(mags > 0, mags, torch.inf).amin(1)
    steps = torch.where(torch.isfinite(smallest), torch.nan, 1.0)     # an all-zero row: any step
    for _ in range(MAX_STEPS):
        todo = torch.isnan(steps).nonzero()[:, 0]
        if not len(todo):
            return steps
        step = float(smallest[todo].min())
        fits = _fits(w[todo], step, top)
        if not bool(fits[smallest[todo] == step].all()):   # a row whose own smallest is not its step
            return None
        steps[todo[fits]] = step
    return None if bool(torch.isnan(steps).any()) else steps


class HalfGridProduct:
    """x (..., in) -> x @ W^T + b for a weight (out, in) on an int8 grid (`row_steps`): its whole
    numbers stored as float16 (exact), multiplied in float32 by fbgemm's half-precision-weight
    product, the sums then scaled by each row's step. A derived, read-only copy; `of` gives None
    where the weight has no grid or the kernel is missing (the caller keeps its float32 product)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, steps: torch.Tensor):
        whole = torch.round(weight.detach().float() / steps[:, None])
        self.packed = torch.ops.quantized.linear_prepack_fp16(whole, None)
        self.steps, self.bias = steps, None if bias is None else bias.detach()
        self.shape = tuple(weight.shape)

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "HalfGridProduct | None":
        if weight.dim() != 2 or not half_kernel_works():
            return None
        steps = row_steps(weight)
        return None if steps is None else cls(weight, bias, steps)

    def nbytes(self) -> int:
        return 2 * self.shape[0] * self.shape[1] + 4 * self.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        sums = torch.ops.quantized.linear_dynamic_fp16(x, self.packed)
        return sums.mul_(self.steps) if self.bias is None else torch.addcmul(self.bias, sums, self.steps)
