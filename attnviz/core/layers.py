"""The leaf modules the blocks are built of: linear (with a prepacked fast path), norms, the MLP
(dense or a sparse mixture of experts) and layer scale. `frozen` turns a norm into the linear map it
is at one input, which readouts use to split a normed sum into its parts."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnviz.core.config import Config
from attnviz.core.row_products import HALF_ROWS, HalfGridProduct

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),   # CLIP's approximation, as trained
}


def _version(t: torch.Tensor):
    """In-place change counter; tensors made under inference_mode have none (and cannot be
    changed outside it)."""
    return None if t.is_inference() else t._version


class Linear(nn.Linear):
    """nn.Linear that, for inference (no grad), can use a oneDNN-prepacked copy of its weight:
    the same product, 15-40 % faster for the small row counts a trace runs on x86 CPUs (measured in
    bench/speed_vs_transformers.py). The copy is made once by `pack()` before a model is shared;
    if the weight is changed in place afterwards (training), the plain path is used again. Writes
    through `.data` bypass PyTorch's change counter: call `pack()` again after those. `half=True`
    (the translators' encoder and output layer) also keeps the weight's int8 grid, where it has
    one, as float16 whole numbers for products of up to HALF_ROWS rows (`HalfGridProduct`: the
    same product up to rounding, from half the bytes)."""

    _packed = None
    _packed_version = -1
    _half = None

    def pack(self, rows_hint: int = 128, half: bool = False) -> bool:
        if self.weight.numel() == 0 or self.weight.dtype != torch.float32 or self.weight.is_meta:
            return False
        try:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), rows_hint)
        except (RuntimeError, AttributeError):  # no oneDNN in this build (some aarch64 wheels)
            self._packed = self._half = None
            return False
        self._half = HalfGridProduct.of(self.weight, self.bias) if half else None
        self._packed_version = _version(self.weight)
        return True

    def _use_packed(self, x) -> bool:
        return (self._packed is not None and not torch.is_grad_enabled() and x.dtype == torch.float32
                and _version(self.weight) == self._packed_version)

    def forward(self, x, act: str = "none"):
        """`act`: "gelu", "gelu_tanh" or "relu" fuses that activation into the product on the packed
        path (the same numbers as applying it after: the activation runs on the finished sums)."""
        if self._use_packed(x):
            if self._half is not None and x.numel() <= HALF_ROWS * x.shape[-1]:
                y = self._half(x)
                return y if act == "none" else ACTIVATIONS[act](y)
            algorithm = "tanh" if act == "gelu_tanh" else "" if act == "relu" else "none"
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._packed, self.bias,
                                                      "gelu" if act.startswith("gelu") else act, [], algorithm)
        y = F.linear(x, self.weight, self.bias)
        return y if act == "none" else ACTIVATIONS[act](y)


class RMSNorm(nn.Module):
    """x / rms(x) * weight. Gemma's norms multiply by (1 + w): folded into `weight` when loaded."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class HeadsRMSNorm(nn.Module):
    """One RMSNorm over every head's channels of a position at once (OLMo 2's QK-norm, over the
    layer's h·d_head queries), on heads (B, h, T, dh). It averages over `width` channels, the
    layer's ORIGINAL h·d_head: a pruned layer holds fewer heads and passes the dropped heads'
    channels as `rest` (B, T, r), so each kept head is normed exactly as before."""

    def __init__(self, n_heads: int, d_head: int, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n_heads * d_head))
        self.width, self.eps = width, eps

    def forward(self, x, rest=None):
        dtype, (_, h, _, dh) = x.dtype, x.shape
        x = x.float()
        squares = x.pow(2).sum((1, 3))                                     # (B, T)
        if rest is not None:
            squares = squares + rest.float().pow(2).sum(-1)
        x = x * torch.rsqrt(squares / self.width + self.eps)[:, None, :, None]
        return (self.weight.view(h, 1, dh) * x).to(dtype)


def make_norm(cfg: Config, d: int | None = None) -> nn.Module:
    d = cfg.d_model if d is None else d
    if cfg.norm == "rmsnorm":
        return RMSNorm(d, cfg.norm_eps)
    return nn.LayerNorm(d, eps=cfg.norm_eps, bias=cfg.norm_bias)


def frozen(norm: nn.Module, x: torch.Tensor):
    """`norm` as the affine map it is at the input x [..., d] (its scale frozen there): a linear f,
    a constant c with norm(x) = f(x) + c, so norm(Σ parts) = Σ f(part) + c, and the frozen scale
    (1 / std or 1 / rms, [..., 1]). None: the identity."""
    if norm is None:
        return (lambda p: p), torch.zeros(x.shape[-1]), torch.ones(x.shape[:-1] + (1,))
    x = x.float()
    w = norm.weight.float()
    if isinstance(norm, nn.LayerNorm):
        scale = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
        bias = norm.bias.float() if norm.bias is not None else torch.zeros_like(w)
        return (lambda p: w * (p - p.mean(-1, keepdim=True)) * scale), bias, scale
    scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)      # RMSNorm
    return (lambda p: w * p * scale), torch.zeros_like(w), scale


class MLP(nn.Module):
    def __init__(self, cfg: Config, d_ff: int | None = None):
        super().__init__()
        d_ff = cfg.d_ff if d_ff is None else d_ff
        self.gated = cfg.gated_mlp
        self.act_name = cfg.activation
        self.act = ACTIVATIONS[cfg.activation]
        width = 2 * d_ff if self.gated else d_ff
        self.fc_in = Linear(cfg.d_model, width, bias=cfg.mlp_bias)
        self.fc_out = Linear(d_ff, cfg.d_model, bias=cfg.mlp_bias)

    def forward(self, x):
        if self.gated:  # SwiGLU: act(gate) * up, gate and up fused in one matmul
            gate, up = self.fc_in(x).chunk(2, dim=-1)
            return self.fc_out(self.act(gate) * up)
        if self.act_name in ("gelu", "gelu_tanh", "relu"):
            return self.fc_out(self.fc_in(x, act=self.act_name))
        return self.fc_out(self.act(self.fc_in(x)))


class LayerScale(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * self.lambda1




class Experts(nn.Module):
    """A sparse mixture of gated MLP experts (Mixtral, Qwen3-MoE): a router scores every expert
    per token, the top `experts_per_token` run and their outputs are summed, weighted by the
    router's softmax (renormalised over the chosen ones when `expert_renorm`)."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.top, self.renorm = cfg.experts_per_token, cfg.expert_renorm
        self.router = Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg) for _ in range(cfg.n_experts))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.router(x), dim=-1, dtype=torch.float)
        weight, chosen = probs.topk(self.top, dim=-1)                        # (N, k)
        if self.renorm:
            weight = weight / weight.sum(-1, keepdim=True)
        weight = weight.to(x.dtype)
        out = torch.zeros_like(x)
        for e in chosen.unique().tolist():
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            out.index_add_(0, rows, self.experts[e](x[rows]) * weight[rows, slot, None])
        return out.view(shape)
