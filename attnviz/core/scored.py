"""What one attention layer computed for a text, as analyses read it (see `Scored`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnviz.core.attention import combine, scores, softmax_weights


@dataclass
class Scored:
    """What one attention layer computes for a text (`Attention.explain`), read by analyses (the
    Lab's step-by-step head, long captures) instead of rebuilding attention from config fields:
    the queries and keys as scored, the values, and how the scores are scaled, capped, biased and
    masked.
    `weights(r0, r1)` gives the layer's weights for query rows r0..r1 by the same steps `attend`
    writes out."""
    x: torch.Tensor                  # (B, T, d) the layer's input (the block's input, normed where it is)
    q: torch.Tensor                  # (B, h, T, dh) as scored: QK-norm and RoPE applied
    k: torch.Tensor                  # (B, hkv, S, dh) likewise
    v: torch.Tensor                  # (B, hkv, S, dh)
    kv_of_head: torch.Tensor         # [h] the K/V head each query head reads
    scale: float | None              # multiplies q·kᵀ (None: 1/√dh)
    softcap: float                   # scores -> cap·tanh(scores / cap) (0: none)
    window: int                      # keys within this many positions (0: all)
    causal: bool
    allowed: torch.Tensor | None     # a padding mask, broadcastable to (B, h, T, S)
    rotated: bool = False            # whether RoPE turned q and k
    q_proj: torch.Tensor | None = None    # straight from the projection, before QK-norm and RoPE
    k_proj: torch.Tensor | None = None
    q_normed: torch.Tensor | None = None  # after QK-norm (None: the layer has none)
    k_normed: torch.Tensor | None = None
    bias: torch.Tensor | None = None      # (1, h, 1 or T, S) added to the scaled scores (ALiBi: slope · key
                                          # position; a relative-position bias, MPNet's, T5's or BEiT's: one row per query)
    bias_parts: dict | None = None        # the bias's named parts, each like it (DeBERTa: "c2p", "p2c")

    @property
    def scale_value(self) -> float:
        return 1.0 / math.sqrt(self.q.shape[-1]) if self.scale is None else self.scale

    def mask(self, r0: int = 0, r1: int | None = None) -> torch.Tensor | None:
        """(r, S) bool: which keys query rows r0..r1 may see (causal, window, padding joined)."""
        T, S = self.q.shape[-2], self.k.shape[-2]
        r1 = T if r1 is None else r1
        dist = (torch.arange(r0, r1)[:, None] + (S - T)) - torch.arange(S)[None, :]
        out = None
        if self.causal:
            out = dist >= 0
        if self.window:
            near = dist < self.window if self.causal else dist.abs() < self.window
            out = near if out is None else out & near
        pad = self.allowed
        if pad is not None and pad.shape[-2] == T:
            pad = pad[..., r0:r1, :]
        return combine(out, pad)

    def keys(self) -> torch.Tensor:
        """(B, h, S, dh) the keys each query head reads."""
        return self.k[:, self.kv_of_head]

    def values(self) -> torch.Tensor:
        return self.v[:, self.kv_of_head]

    def bias_rows(self, r0: int = 0, r1: int | None = None) -> torch.Tensor | None:
        """The score bias of query rows r0..r1 (a bias of one row serves every query)."""
        if self.bias is None or self.bias.shape[-2] == 1:
            return self.bias
        return self.bias[..., r0:r1, :]

    def logits(self, r0: int = 0, r1: int | None = None, temperature: float = 1.0) -> torch.Tensor:
        """(B, h, r, S) scaled (capped, biased) scores of query rows r0..r1, before the mask."""
        return scores(self.q[:, :, r0:r1], self.keys(), self.scale, temperature, self.softcap,
                      self.bias_rows(r0, r1))

    def weights(self, r0: int = 0, r1: int | None = None) -> torch.Tensor:
        """(B, h, r, S) the softmax weights of query rows r0..r1."""
        return softmax_weights(self.q[:, :, r0:r1], self.keys(), self.mask(r0, r1), self.scale,
                               softcap=self.softcap, bias=self.bias_rows(r0, r1))
