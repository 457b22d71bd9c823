"""The input stage of speech encoders (wav2vec 2.0, HuBERT): 16 kHz samples -> frames of d_model, as
the patch embedding is vision's. What follows it is the core `Transformer`'s blocks, run by the one
block runner with the one attention module: attention over frames is attention over tokens.

    samples (B, n) -> convolutions (each: conv, its norm, activation) -> (B, T, C)   T = `frame_count(n)`
    -> LayerNorm over C (`feature_norm`) -> linear C -> d_model
    -> + activation(grouped convolution over the frames)   positional "conv": the only positions
(the checkpoint's weight-normed positional convolution is folded into a plain weight when it is loaded).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from attnviz.core.config import Config
from attnviz.core.layers import ACTIVATIONS, Linear

CONV_NORM_EPS = 1e-5   # the feature encoder's norms keep torch's default eps; the config's is the blocks'


def frame_count(cfg: Config, n_samples: int) -> int:
    """Frames the convolutions make of `n_samples` samples (each: (n - kernel) // stride + 1)."""
    n = int(n_samples)
    for _, kernel, stride in cfg.conv_layers:
        n = (n - kernel) // stride + 1 if n >= kernel else 0
    return n


def min_samples(cfg: Config) -> int:
    """The fewest samples that make one frame."""
    n = 1
    for _, kernel, stride in reversed(cfg.conv_layers):
        n = (n - 1) * stride + kernel
    return n


class AudioFrames(nn.Module):
    """Samples (B, n) -> frames (B, T, d_model), positions added (the blocks' input)."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.act = ACTIVATIONS[cfg.conv_activation]
        self.layer_norms = cfg.conv_norm == "layer"
        widths = [1] + [c for c, _, _ in cfg.conv_layers]
        self.convs = nn.ModuleList(nn.Conv1d(widths[i], c, k, stride=s, bias=cfg.conv_bias)
                                   for i, (c, k, s) in enumerate(cfg.conv_layers))
        if self.layer_norms:   # a LayerNorm over the channels after every convolution
            self.conv_norms = nn.ModuleList(nn.LayerNorm(c, eps=CONV_NORM_EPS) for c in widths[1:])
        else:                  # one GroupNorm, a group per channel, after the first convolution only
            self.conv_norms = nn.ModuleList([nn.GroupNorm(widths[1], widths[1], eps=CONV_NORM_EPS)])
        self.feature_norm = nn.LayerNorm(widths[-1], eps=cfg.norm_eps) if cfg.feature_norm else None
        self.proj = Linear(widths[-1], cfg.d_model)
        k = cfg.pos_conv_kernel
        self.pos_conv = nn.Conv1d(cfg.d_model, cfg.d_model, k, padding=k // 2, groups=cfg.pos_conv_groups)
        self.drop_last = k % 2 == 0   # an even kernel, padded k // 2 both sides, makes one frame too many

    def features(self, samples):
        """samples (B, n) -> the last convolution's output (B, T, C)."""
        x = samples[:, None]                                   # (B, 1, n)
        for i, conv in enumerate(self.convs):
            x = conv(x)                                        # (B, C_i, T_i)
            if self.layer_norms:
                x = self.conv_norms[i](x.transpose(1, 2)).transpose(1, 2)
            elif i == 0:
                x = self.conv_norms[0](x)
            x = self.act(x)
        return x.transpose(1, 2)

    def positions(self, x):
        """frames (B, T, d) -> what the positional convolution adds to them (B, T, d)."""
        p = self.pos_conv(x.transpose(1, 2))                   # (B, d, T (+1))
        if self.drop_last:
            p = p[:, :, :-1]
        return self.act(p).transpose(1, 2)

    def forward(self, samples):
        x = self.features(samples)
        if self.feature_norm is not None:
            x = self.feature_norm(x)
        x = self.proj(x)
        return x + self.positions(x)

