"""The blocks every model is built of, and THE forward loop that runs them (`iter_layers`).

Leaf modules first (linear, norm, THE attention module, MLP), then the encoder / decoder-only
`Block` (self-attention, MLP); the encoder-decoder's `CrossBlock` lives in
`attnviz.core.decoder_blocks`. Every block kind takes the same per-layer arguments (head mask, mean
ablation's fill, captured weights, variant, per-call cache), so one loop runs them all. Capture,
masks and variants are arguments, never state: one loaded model serves every caller at once.

A new block kind is an nn.Module whose `forward(x, *, head_mask, need_weights, variant, heads_out,
head_fill, past, **shared)` returns (out, weights) and whose attention is `Attention`; its
per-call state goes in `past` (its layer's dict of the cache), and a fused fast path, if any, is
`step_row(x, past, into, head_mask, head_fill)`, run by `iter_layers(row=True)`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnviz.core.attention import SOFTMAX, Variant, attend
from attnviz.core.config import Config
from attnviz.core.positional import apply_rope
from attnviz.core.row_products import HALF_ROWS, HalfGridProduct

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
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
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def make_norm(cfg: Config) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.d_model, cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)


class Attention(nn.Module):
    """THE attention module: multi-head attention with grouped K/V heads, one fused QKV projection
    (`fused=True`) or a query projection `q` and a K/V one `kv` (`fused=False`: cross-attention,
    whose keys and values come from another source, the encoder's output; see `keys_values`).

    `heads` are the ORIGINAL indices of the query heads this layer holds (all of them unless
    pruned); `kv_of_head[i]` is the local K/V head that query head i reads.
    """

    def __init__(self, cfg: Config, heads: list[int] | None = None, kv_heads: list[int] | None = None,
                 fused: bool = True):
        super().__init__()
        heads = list(range(cfg.n_heads)) if heads is None else list(heads)
        kv_heads = list(range(cfg.n_kv_heads)) if kv_heads is None else list(kv_heads)
        self.n_heads, self.n_kv, self.d_head = len(heads), len(kv_heads), cfg.d_head
        d, h, hkv = cfg.d_model, self.n_heads * cfg.d_head, self.n_kv * cfg.d_head
        if fused:
            self.qkv = Linear(d, h + 2 * hkv, bias=cfg.qkv_bias)
        else:
            self.q, self.kv = Linear(d, h, bias=cfg.qkv_bias), Linear(d, 2 * hkv, bias=cfg.qkv_bias)
        self.fused = fused
        self.out = Linear(self.n_heads * cfg.d_head, d, bias=cfg.out_bias)
        # Buffers are built on the CPU explicitly: `Transformer.from_state` constructs on "meta".
        self.register_buffer("heads", torch.tensor(heads, dtype=torch.long, device="cpu"), persistent=False)
        kv_local = {kv: i for i, kv in enumerate(kv_heads)}
        kv_of_head = [kv_local[h // cfg.group] for h in heads]
        self.register_buffer("kv_of_head", torch.tensor(kv_of_head, dtype=torch.long, device="cpu"),
                             persistent=False)
        # Uniform grouping lets the fused kernel handle GQA; a pruned, uneven one indexes K/V explicitly.
        self.uniform_groups = (self.n_kv > 0 and self.n_heads % self.n_kv == 0 and
                               kv_of_head == [i // (self.n_heads // self.n_kv) for i in range(self.n_heads)])

    def forward(self, x, *, rope=None, allowed=None, causal=False, head_mask=None,
                need_weights=False, variant: Variant = SOFTMAX, heads_out=None, head_fill=None, past=None,
                kv=None, patch=None):
        """`past`: this layer's K/V cache, a dict ("k", "v": (B, hkv, S, dh), rope applied) that is
        extended in place (incremental decoding); `kv`: keys and values computed once from another
        source (`keys_values`: cross-attention), then only the queries come from x; `heads_out`: a
        list the per-head outputs (B, h, T, dh), before the output projection, are appended to
        (logit attribution); `head_fill` [H, dh]: added to each head's output after the mask
        (mean ablation); `patch(name, t) -> t`: this call's edit of "q" (B, h, T, dh), "k" and "v"
        (B, hkv, T, dh, rope applied) and "z" (the per-head outputs, after mask and fill):
        activation patching, never a change to the module."""
        B, T, _ = x.shape
        if self.n_heads == 0:  # every head of this layer pruned: the layer adds only the output bias
            return self.out(x.new_zeros(B, T, 0)), None
        if kv is not None:
            q, (k, v) = self.queries(x), kv
        else:
            q, k, v = self.project(x, rope)
        if patch is not None:
            q, k, v = patch("q", q), patch("k", k), patch("v", v)
        if past is not None and kv is None:  # the keys and values of the tokens before these, then these
            if "k" in past:
                k, v = torch.cat([past["k"], k], 2), torch.cat([past["v"], v], 2)  # (B, hkv, S, dh)
            past["k"], past["v"] = k, v
        if not self.uniform_groups:
            k, v = k[:, self.kv_of_head], v[:, self.kv_of_head]
        y, att = attend(q, k, v, causal=causal, allowed=allowed, variant=variant, need_weights=need_weights,
                        training=self.training)
        if head_mask is not None:  # multiplies each head's output before the output projection
            y = y * head_mask[self.heads].to(y.dtype)[None, :, None, None]
        if head_fill is not None:
            y = y + head_fill[self.heads].to(y.dtype)[:, None, :][None]          # (1, h, 1, dh)
        if patch is not None:
            y = patch("z", y)
        if heads_out is not None:
            heads_out.append(y)
        y = y.transpose(1, 2).reshape(B, T, -1)      # (B, T, h*dh)
        return self.out(y), att

    def queries(self, x):
        """x (B, T, d) -> q (B, h, T, dh) (an un-fused layer: the keys and values come from elsewhere)."""
        B, T, _ = x.shape
        return self.q(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)

    def keys_values(self, source):
        """source (B, S, d) -> k, v, each (B, hkv, S, dh): an un-fused layer's keys and values."""
        B, S, _ = source.shape
        k, v = self.kv(source).view(B, S, 2, self.n_kv, self.d_head).permute(2, 0, 3, 1, 4)
        return k, v

    def project(self, x, rope=None):
        """x (B, T, d) -> q (B, h, T, dh), k and v (B, hkv, T, dh); RoPE applied to q and k."""
        B, T, _ = x.shape
        h, hkv, dh = self.n_heads, self.n_kv, self.d_head
        if not self.fused:
            q, (k, v) = self.queries(x), self.keys_values(x)
        else:
            q, k, v = self.qkv(x).split([h * dh, hkv * dh, hkv * dh], dim=-1)
            q = q.view(B, T, h, dh).transpose(1, 2)
            k, v = (t.view(B, T, hkv, dh).transpose(1, 2) for t in (k, v))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return q, k, v


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.gated = cfg.gated_mlp
        self.act_name = cfg.activation
        self.act = ACTIVATIONS[cfg.activation]
        width = 2 * cfg.d_ff if self.gated else cfg.d_ff
        self.fc_in = Linear(cfg.d_model, width, bias=cfg.mlp_bias)
        self.fc_out = Linear(cfg.d_ff, cfg.d_model, bias=cfg.mlp_bias)

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


class Block(nn.Module):
    def __init__(self, cfg: Config, heads=None, kv_heads=None):
        super().__init__()
        self.pre_norm = cfg.pre_norm
        self.norm1, self.norm2 = make_norm(cfg), make_norm(cfg)
        self.attn = Attention(cfg, heads, kv_heads)
        self.mlp = MLP(cfg)
        self.ls1 = LayerScale(cfg.d_model) if cfg.layer_scale else nn.Identity()
        self.ls2 = LayerScale(cfg.d_model) if cfg.layer_scale else nn.Identity()

    def forward(self, x, **attn_kw):
        if self.pre_norm:
            a, att = self.attn(self.norm1(x), **attn_kw)
            x = x + self.ls1(a)
            return x + self.ls2(self.mlp(self.norm2(x))), att
        a, att = self.attn(x, **attn_kw)  # BERT: post-norm
        x = self.norm1(x + a)
        return self.norm2(x + self.mlp(x)), att




@dataclass
class BlockStep:
    """One step of the forward loop (`iter_layers`)."""
    layer: int
    x: torch.Tensor                            # (B, n, d_model) the block's input
    out: torch.Tensor                          # (B, n, d_model) its output
    weights: torch.Tensor | None               # (B, h_layer, n, S) when this layer was captured
    heads: torch.Tensor | None = None          # (B, h_layer, n, d_head) per-head outputs, when asked
    self_weights: torch.Tensor | None = None   # (B, h, n, t) a decoder block's self-attention, when asked


def iter_layers(blocks, x, start: int = 0, stop: int | None = None, *, head_mask=None, capture=(),
                weights_out=None, variants=None, check=None, head_outputs=(), head_fill=None, cache=None,
                self_head_mask=None, self_capture=(), row: bool = False, patch=None, **shared):
    """THE forward loop, for every model: blocks start..stop-1 of `blocks` from x = the input of
    block `start`, yielding a `BlockStep` per block (callers that look at one layer at a time, such
    as long captures and head scores, never hold every layer's weights).
    `head_mask` [L, H] (1 keeps a head); `capture`: layers whose weights to return; `weights_out`:
    {layer: tensor} (or one [L, ...] tensor) to write those layers' weights into; `variants`: a
    Variant for every layer, or {layer: Variant} for some; `check()` runs before every block (a
    deadline or a cancel); `head_outputs`: layers whose per-head outputs to return; `head_fill`
    [L, H, d_head]: added to the heads' outputs after the mask (mean ablation); `cache`: one dict
    per layer, the per-call state (K/V, an SSRU cell, the encoder's K/V); `self_head_mask` and
    `self_capture`: a decoder block's self-attention; `row`: one row (1, d) through each block's
    fused `step_row` path; `patch`: {layer: patch(name, tensor) -> tensor}, passed to that layer's
    `Attention` (activation patching, see `Attention.forward`); `shared`: passed to every block (rope, allowed, causal)."""
    stop = len(blocks) if stop is None else int(stop)
    if not 0 <= start <= stop <= len(blocks):
        raise ValueError(f"blocks {start}..{stop} are outside 0..{len(blocks)}")
    head_outputs, capture, self_capture = set(head_outputs), set(capture), set(self_capture)
    per_layer = variants if isinstance(variants, dict) else {}
    default_variant = variants if isinstance(variants, Variant) else SOFTMAX
    for i in range(start, stop):
        if check is not None:
            check()
        into = weights_out.get(i) if isinstance(weights_out, dict) else \
            None if weights_out is None else weights_out[i]
        mask = None if head_mask is None else head_mask[i]
        fill = None if head_fill is None else head_fill[i]
        past = None if cache is None else cache[i]
        if row:
            out = blocks[i].step_row(x, past, into, mask, fill)
            yield BlockStep(i, x, out, into)
            x = out
            continue
        z = [] if i in head_outputs else None
        kw = {} if self_head_mask is None else {"self_head_mask": self_head_mask[i]}
        if patch is not None and i in patch:
            kw["patch"] = patch[i]
        if i in self_capture:
            kw["self_weights_out"] = []
        out, att = blocks[i](x, head_mask=mask, need_weights=i in capture if into is None else into,
                             variant=per_layer.get(i, default_variant), heads_out=z, head_fill=fill,
                             past=past, **kw, **shared)
        yield BlockStep(i, x, out, att, z[0] if z else None,
                        kw["self_weights_out"][0] if "self_weights_out" in kw else None)
        x = out
        del att
