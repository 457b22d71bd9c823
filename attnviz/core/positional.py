"""Positional encodings: sinusoidal (1-D and 2-D), learned (a table the model owns), rotary (RoPE), ALiBi."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def sinusoidal(n: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """Vaswani et al. 2017: PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(...). (n, d)."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = base ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    pe = torch.zeros(n, d)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq[: d // 2])
    return pe


def sinusoidal_2d(rows: int, cols: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """(rows * cols, dim) positions of a grid of patches, row by row (patch p = row p // cols,
    column p % cols): channels [0, dim/2) are `sinusoidal` of the row, [dim/2, dim) of the column,
    each with the standard frequencies of a dim/2-wide table, so no patch shares another's code."""
    if rows < 1 or cols < 1:
        raise ValueError(f"a grid needs at least one row and one column; got {rows} x {cols}")
    if dim < 4 or dim % 4:
        raise ValueError(f"2-D sinusoidal positions need a width that is a multiple of 4 (sin and cos "
                         f"for the row and for the column); got {dim}")
    half = dim // 2
    row = sinusoidal(rows, half, base)[:, None, :].expand(rows, cols, half)
    col = sinusoidal(cols, half, base)[None, :, :].expand(rows, cols, half)
    return torch.cat([row, col], dim=-1).reshape(rows * cols, dim)


def rope_cos_sin(n: int, d_head: int, theta: float = 10000.0, offset: int = 0):
    """cos, sin tables (n, d_head) in the half-split layout transformers' Llama uses."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=torch.int64).float() / d_head))
    pos = torch.arange(offset, offset + n, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)           # (n, d_head/2)
    emb = torch.cat((freqs, freqs), dim=-1)      # (n, d_head)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, h, T, dh) queries or keys by their position's angle."""
    return x * cos + rotate_half(x) * sin


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al. 2022: geometric slopes 2^(-8/n), 2^(-16/n), ... (interleaved for non-powers of 2)."""
    def power_of_2(n):
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]
    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_2(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_2(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_2(closest) + extra)


def alibi_bias(n: int, n_heads: int, causal: bool = True) -> torch.Tensor:
    """(h, n, n) additive score bias: -slope * distance."""
    i = torch.arange(n)
    dist = (i[:, None] - i[None, :]).abs().float() if not causal else (i[:, None] - i[None, :]).clamp_min(0).float()
    return -alibi_slopes(n_heads)[:, None, None] * dist


def interpolate_grid(pos: torch.Tensor, src: int, h: int, w: int) -> torch.Tensor:
    """Resize a (1, src*src, d) patch position table to an h x w grid: bicubic in float32, as
    transformers' ViT and DINOv2 do when the image size differs from the pretraining size."""
    if (h, w) == (src, src):
        return pos
    d = pos.shape[-1]
    grid = pos.reshape(1, src, src, d).permute(0, 3, 1, 2)  # (1, d, src, src)
    grid = F.interpolate(grid.to(torch.float32), size=(h, w), mode="bicubic", align_corners=False)
    return grid.to(pos.dtype).permute(0, 2, 3, 1).reshape(1, h * w, d)
