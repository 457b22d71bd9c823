"""Positional encodings as tables the lab draws: a model's learned table, RoPE's angles and the
similarity it induces, sinusoidal and ALiBi tables, and similarity by distance."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnviz.core.model import Model
from attnviz.core.positional import alibi_bias, apply_rope, rope_cos_sin, sinusoidal


def learned_table(model: Model) -> torch.Tensor | None:
    """The model's learned position table [positions, d_model], or None if it has none."""
    pos = getattr(model.net, "pos", None)
    if isinstance(pos, torch.nn.Embedding):
        return pos.weight.detach()
    if isinstance(pos, torch.nn.Parameter):  # vision: CLS + patch grid
        return pos.detach()[0]
    return None


def rope_angles(n: int, d_head: int, theta: float = 10000.0) -> torch.Tensor:
    """[n, d_head/2]: the angle (radians, wrapped to [-π, π]) each position turns each pair by."""
    cos, sin = rope_cos_sin(n, d_head, theta)
    half = d_head // 2
    return torch.atan2(sin[:, :half], cos[:, :half])


def rope_similarity(n: int, d_head: int, theta: float = 10000.0) -> torch.Tensor:
    """[n, n]: the dot product of one unit vector placed at positions i and j after rotation.
    It depends only on i - j: RoPE turns content similarity into relative position."""
    u = torch.ones(1, d_head) / math.sqrt(d_head)
    cos, sin = rope_cos_sin(n, d_head, theta)
    rotated = apply_rope(u, cos, sin)                                      # (n, d_head)
    return rotated @ rotated.T


def cosine_similarity(table: torch.Tensor) -> torch.Tensor:
    """[n, n] cosine similarity between the rows of a position table."""
    unit = F.normalize(table.float(), dim=-1)
    return unit @ unit.T


def by_distance(sim: torch.Tensor) -> torch.Tensor:
    """[n]: mean of sim[i, i + k] over i, for each distance k = 0..n-1."""
    n = sim.shape[0]
    return torch.stack([sim.diagonal(k).mean() for k in range(n)])


def sinusoidal_table(n: int, d: int) -> torch.Tensor:
    return sinusoidal(n, d)


def alibi_table(n: int, n_heads: int, causal: bool = True) -> torch.Tensor:
    return alibi_bias(n, n_heads, causal)
