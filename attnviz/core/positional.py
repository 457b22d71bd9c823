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


def rope_frequencies(dim: int, theta: float = 10000.0, scaling: tuple = ()) -> tuple[torch.Tensor, float]:
    """(inverse frequencies (dim/2,), attention factor) of RoPE over `dim` channels, with the
    rope scaling `scaling` (pairs as `Config.rope_scaling` holds them) as transformers computes
    it: linear, dynamic (the same as none within the original context, all we run), yarn, llama3."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    p = dict(scaling)
    kind = p.get("rope_type", "default")
    if kind in ("default", "dynamic"):
        return inv_freq, 1.0
    factor = float(p["factor"])
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        old = p["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / p["low_freq_factor"], old / p["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - p["low_freq_factor"]) / (p["high_freq_factor"] - p["low_freq_factor"])
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        return _yarn(dim, theta, p, factor)
    raise ValueError(f"rope scaling {kind!r} is not supported")


def _yarn(dim: int, theta: float, p: dict, factor: float) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023) as transformers' `_compute_yarn_parameters`."""
    old = p.get("original_max_position_embeddings") or p["max_position_embeddings"]

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        if p.get("mscale") and p.get("mscale_all_dim"):
            attention_factor = mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extra = 1 - ramp
    return interpolation * (1 - extra) + extrapolation * extra, float(attention_factor)


def rope_cos_sin(n: int, d_head: int, theta: float = 10000.0, offset: int = 0, scaling: tuple = ()):
    """cos, sin tables (n, d_head) in the half-split layout transformers' Llama uses (`d_head`:
    the channels that rotate), scaled by the rope scaling's attention factor."""
    inv_freq, factor = rope_frequencies(d_head, theta, scaling)
    pos = torch.arange(offset, offset + n, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)           # (n, d_head/2)
    emb = torch.cat((freqs, freqs), dim=-1)      # (n, d_head)
    if factor == 1.0:
        return emb.cos(), emb.sin()
    return emb.cos() * factor, emb.sin() * factor


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, h, T, dh) queries or keys by their position's angle; tables narrower than dh
    rotate the first channels and pass the rest (partial rotary: GPT-NeoX, Phi)."""
    rd = cos.shape[-1]
    if rd < x.shape[-1]:
        rot, rest = x[..., :rd], x[..., rd:]
        return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)
    return x * cos + rotate_half(x) * sin


def alibi_slopes(n_heads: int, device=None) -> torch.Tensor:
    """Press et al. 2022: geometric slopes 2^(-8/n), 2^(-16/n), ... (interleaved for non-powers of 2),
    as BLOOM computes them."""
    def power_of_2(n):
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]
    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_2(n_heads), device=device)
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_2(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_2(closest) + extra, device=device)


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


def relative_buckets(relative: torch.Tensor, bidirectional: bool, n_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's distance buckets (Raffel et al. 2020, as transformers' `_relative_position_bucket`):
    `relative` = key position - query position -> a bucket in [0, n_buckets). Half the buckets
    (of each direction, when bidirectional) count distances exactly, the rest grow logarithmically
    up to `max_distance`; a causal decoder sees no later key, so its later distances read as 0."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        n_buckets //= 2
        buckets = buckets + (relative > 0).long() * n_buckets
        relative = relative.abs()
    else:
        relative = -relative.clamp_max(0)
    exact = n_buckets // 2
    large = exact + (torch.log(relative.float() / exact) / math.log(max_distance / exact)
                     * (n_buckets - exact)).long()
    large = large.clamp_max(n_buckets - 1)
    return buckets + torch.where(relative < exact, relative, large)


class RelativeBias(torch.nn.Module):
    """One side's relative position bias (T5): a learned value per head and distance bucket, computed
    once for a pass and added to the scaled scores of every self-attention layer of that side."""

    def __init__(self, n_buckets: int, n_heads: int, max_distance: int, bidirectional: bool):
        super().__init__()
        self.table = torch.nn.Embedding(n_buckets, n_heads)   # (buckets, h)
        self.max_distance, self.bidirectional = max_distance, bidirectional

    def forward(self, T: int, S: int) -> torch.Tensor:
        """(1, h, T, S): the bias of queries at positions S-T..S-1 (after a cached prefix) over keys 0..S-1."""
        device = self.table.weight.device
        relative = torch.arange(S, device=device)[None, :] - torch.arange(S - T, S, device=device)[:, None]
        buckets = relative_buckets(relative, self.bidirectional, self.table.num_embeddings, self.max_distance)
        return self.table(buckets).permute(2, 0, 1)[None]


def log_bucket(distance: torch.Tensor, span: int, max_position: int) -> torch.Tensor:
    """DeBERTa's log-bucketed relative positions: distances within span/2 as they are, longer ones
    on a log scale that reaches ±span at `max_position`. `distance`: query position - key position."""
    sign = torch.sign(distance)
    mid = span // 2
    near = (distance < mid) & (distance > -mid)
    size = torch.where(near, torch.tensor(mid - 1).type_as(distance), distance.abs())
    log_pos = torch.ceil(torch.log(size / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1)) + mid
    return torch.where(size <= mid, distance.type_as(log_pos), log_pos * sign).long()


def relative_index(n: int, span: int, log_max: int = 0) -> torch.Tensor:
    """(n, n) long: the row of the (2·span, d) relative-position embeddings each query-key pair
    reads (query position - key position, log-bucketed when `log_max` > 0, clamped to the span)."""
    pos = torch.arange(n)
    distance = pos[:, None] - pos[None, :]
    if log_max > 0:
        distance = log_bucket(distance, span, log_max)
    return (distance + span).clamp(0, 2 * span - 1)


def disentangled_terms(q, k, pos_q, pos_k, index) -> dict[str, torch.Tensor]:
    """DeBERTa's position terms of every head's scores, before the scale: "c2p", query i · the
    position key of its distance to key j; "p2c", key j · the position query of that distance
    (the distance is antisymmetric and its buckets odd, so one index serves both).
    q, k (B, h, T, dh); pos_q, pos_k (h, 2·span, dh) or None; index (T, T) -> each (B, h, T, T)."""
    out = {}
    B, h, T, _ = q.shape
    if pos_k is not None:
        out["c2p"] = torch.gather(q @ pos_k.transpose(-1, -2), -1, index.expand(B, h, T, T))
    if pos_q is not None:
        out["p2c"] = torch.gather(k @ pos_q.transpose(-1, -2), -1, index.T.expand(B, h, T, T)).transpose(-1, -2)
    return out


def square_grid(n_patches: int) -> tuple[int, int]:
    """The (side, side) grid of n patches; ValueError when n is not a square (a relative
    position bias is read on a square grid here)."""
    side = math.isqrt(max(n_patches, 0))
    if side < 1 or side * side != n_patches:
        raise ValueError(f"a relative position bias needs a square grid of patches; got {n_patches} patches")
    return side, side


def grid_relative_index(grid: tuple[int, int]) -> torch.Tensor:
    """(1 + gh*gw, 1 + gh*gw) long: each (query, key) pair's row in a BEiT relative position table
    of (2gh-1)(2gw-1) patch offsets, then three rows: CLS to a patch, a patch to CLS, CLS to CLS."""
    gh, gw = grid
    n_offsets = (2 * gh - 1) * (2 * gw - 1)
    coords = torch.stack(torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")).flatten(1)  # (2, P)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)                          # (P, P, 2)
    index = torch.zeros(gh * gw + 1, gh * gw + 1, dtype=torch.long)
    index[1:, 1:] = (rel[..., 0] + gh - 1) * (2 * gw - 1) + rel[..., 1] + gw - 1
    index[0, :], index[:, 0], index[0, 0] = n_offsets, n_offsets + 1, n_offsets + 2
    return index


def relative_bias(table: torch.Tensor, trained: tuple[int, int], grid: tuple[int, int]) -> torch.Tensor:
    """A BEiT relative position table ((2th-1)(2tw-1) + 3, h), learned on the `trained` grid ->
    the (h, 1 + gh*gw, 1 + gh*gw) bias of a `grid` of patches: the patch-offset part resized
    bilinearly as transformers does (unchanged on the trained grid), the three CLS rows as they are."""
    th, tw = 2 * trained[0] - 1, 2 * trained[1] - 1
    nh, nw = 2 * grid[0] - 1, 2 * grid[1] - 1
    offsets = table[: th * tw]
    if (nh, nw) != (th, tw):
        offsets = offsets.reshape(1, tw, th, -1).permute(0, 3, 1, 2)
        offsets = F.interpolate(offsets, size=(nh, nw), mode="bilinear").permute(0, 2, 3, 1).reshape(nh * nw, -1)
    full = torch.cat([offsets, table[th * tw:]])
    return full[grid_relative_index(grid)].permute(2, 0, 1)                                        # (h, n, n)
