"""The encoder-decoder's decoder block kind, `CrossBlock`, and its SSRU.

A `CrossBlock` takes the arguments every block of `attnviz.core.blocks.iter_layers` takes, so the
decoders of the translators and Whisper run through the same loop as every other model; its fused
one-row `step_row` is that loop's `row=True` path (greedy decoding of the Bergamot students).

Cross-attention: queries from the decoder's current position, keys and values from the encoder's
output, so row t of a cross-attention map [T, S] says which source tokens the decoder read while
choosing target token t.
"""
from __future__ import annotations

import math
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnviz.core.attention import SOFTMAX, Variant
from attnviz.core.blocks import MLP, Attention, Linear, make_norm
from attnviz.core.config import Config
from attnviz.core.row_products import RowProduct

_ROW_LOCK = threading.Lock()   # one thread builds a shared model's row layout; the others wait for it


class SSRU(nn.Module):
    """Simpler Simple Recurrent Unit (Kim et al. 2019), the Bergamot decoder's replacement for
    self-attention: f_t = sigmoid(x_t W_f + b_f), c_t = f_t * c_{t-1} + (1 - f_t) * (x_t W),
    out_t = relu(c_t). Only c carries the past (`past["c"]`): a step costs the same at every position."""

    def __init__(self, d: int):
        super().__init__()
        self.W = Linear(d, d, bias=False)
        self.Wf = Linear(d, d)
        self._fused, self._fused_version = None, None

    def plain(self) -> bool:  # plain linear layers: weights fused (a quantized copy's layers are called)
        return isinstance(self.W, nn.Linear) and isinstance(self.Wf, nn.Linear)

    def fused(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[W; W_f] (2d, d) and [0; b_f]: both products in one matmul (one dispatch a step).
        Rebuilt when either weight changes (training, a loaded state)."""
        version = (self.W.weight._version, self.Wf.weight._version, self.Wf.bias._version,
                   self.W.weight.data_ptr(), self.Wf.weight.data_ptr())
        if self._fused_version != version:
            w = torch.cat([self.W.weight, self.Wf.weight]).detach()
            self._fused = (w, torch.cat([torch.zeros_like(self.Wf.bias), self.Wf.bias]).detach())
            self._fused_version = version
        return self._fused

    def forward(self, x, past: dict):
        """x (B, T, d) -> out (B, T, d); past["c"] (B, d), absent at the start (zeros), is advanced."""
        if torch.is_grad_enabled() or not self.plain():  # training (gradients reach W and W_f) or replaced layers
            wx, f = self.W(x), torch.sigmoid(self.Wf(x))
        else:
            wx, f = F.linear(x, *self.fused()).chunk(2, dim=-1)   # (B, T, d) each
            f = torch.sigmoid(f)
        z = (1 - f) * wx                           # (B, T, d): the input's share of each step
        c = past.get("c")
        if x.shape[1] == 1:                        # one decoding step: no loop
            c = z[:, 0] if c is None else torch.addcmul(z[:, 0], f[:, 0], c)
            past["c"] = c
            return torch.relu(c)[:, None]
        out = torch.empty_like(z)
        for t in range(x.shape[1]):
            c = z[:, t] if c is None else torch.addcmul(z[:, t], f[:, t], c)
            out[:, t] = c
        past["c"] = c
        return torch.relu(out)


class CrossBlock(nn.Module):
    """The encoder-decoder's decoder block: the target positions' own mixing (`mixer` "attention":
    causal self-attention, its K/V in the per-call cache; "ssru": an SSRU, its cell in the cache),
    then cross-attention over the encoder's output (its K/V computed once per decoding, in the cache
    as "memory"), then the MLP. Post-norm (residual, then LayerNorm) or pre-norm (Whisper). The head
    mask, fill, variant, captured weights and `patch` (see `Attention.forward`) are the
    cross-attention's; `self_head_mask`, `self_weights_out` and `position_bias` (T5's relative
    positions, computed once for every layer) the self-attention's."""

    def __init__(self, cfg: Config, mixer: str, causal: bool = True, source_width: int | None = None):
        """`causal=False`: the self-attention reads every position (a text encoder over an image,
        BLIP's); `source_width`: the width of what cross-attention reads, when not d_model."""
        super().__init__()
        self.pre_norm, self.relu = cfg.pre_norm, cfg.activation == "relu"
        self.causal = causal
        # built in this order (cross-attention and MLP first): a seeded model starts from the same
        # random weights as before the decoders shared the block runner
        self.cross = Attention(cfg, fused=False, source_width=source_width)
        self.norm_cross = make_norm(cfg)
        self.mlp = MLP(cfg)
        self.norm_ffn = make_norm(cfg)
        if mixer == "ssru":
            self.ssru = SSRU(cfg.d_model)
            self.norm_ssru = make_norm(cfg)
        else:
            self.self_attn = Attention(cfg, fused=False)
            self.norm_self = make_norm(cfg)

    @property
    def has_ssru(self) -> bool:
        return hasattr(self, "ssru")

    def forward(self, x, *, past: dict, allowed=None, head_mask=None, need_weights=False,
                variant: Variant = SOFTMAX, heads_out=None, head_fill=None, self_head_mask=None,
                self_weights_out=None, rope=None, causal=False, patch=None, position_bias=None):
        if self.has_ssru:  # the Bergamot students: post-norm
            x = self.norm_ssru(x + self.ssru(x, past))
        else:
            h = self.norm_self(x) if self.pre_norm else x
            a, s_att = self.self_attn(h, causal=self.causal, head_mask=self_head_mask, past=past,
                                      need_weights=self_weights_out is not None, position_bias=position_bias)
            if self_weights_out is not None:
                self_weights_out.append(s_att)
            x = x + a if self.pre_norm else self.norm_self(x + a)
        cross = dict(kv=past["memory"], allowed=allowed, head_mask=head_mask, need_weights=need_weights,
                     variant=variant, heads_out=heads_out, head_fill=head_fill, patch=patch)
        if self.pre_norm:  # Whisper: x + sublayer(norm(x))
            a, att = self.cross(self.norm_cross(x), **cross)
            x = x + a
            return x + self.mlp(self.norm_ffn(x)), att
        a, att = self.cross(x, **cross)
        x = self.norm_cross(x + a)
        return self.norm_ffn(x + self.mlp(x)), att

    def row_ready(self) -> bool:
        """Whether `step_row` applies: a post-norm ReLU SSRU block of plain linear layers (it reads
        every weight directly, so a quantized copy's replaced layers take `forward`)."""
        if not (self.has_ssru and not self.pre_norm and self.relu):
            return False
        cross, mlp, ssru = self.cross, self.mlp, self.ssru   # a post-norm SSRU block's every linear layer
        return all(isinstance(m, nn.Linear) for m in (ssru.W, ssru.Wf, cross.q, cross.kv, cross.out, mlp.fc_in,
                                                       mlp.fc_out))

    def row_weights(self) -> tuple:
        """The weights `step_row` reads, as one-row products (`RowProduct`: over each weight's
        int8 grid where it has one -- the Bergamot students' every decoder weight -- else float32)
        and the LayerNorms' parameters. A derived read-only copy (~1 MB a block on the grid), built
        once per model under a lock and rebuilt only when a weight changes (training, a loaded
        state); the parameters themselves are never touched."""
        cross, mlp, ssru = self.cross, self.mlp, self.ssru
        sources = (ssru.W.weight, ssru.Wf.weight, ssru.Wf.bias, cross.q.weight, cross.q.bias,
                   cross.out.weight, cross.out.bias, mlp.fc_in.weight, mlp.fc_in.bias, mlp.fc_out.weight,
                   mlp.fc_out.bias, self.norm_ssru.weight, self.norm_ssru.bias, self.norm_cross.weight,
                   self.norm_cross.bias, self.norm_ffn.weight, self.norm_ffn.bias)
        version = tuple((None if t.is_inference() else t._version, t.data_ptr()) for t in sources)
        cached = self.__dict__.get("_row_cache")
        if cached is None or cached[0] != version:
            with _ROW_LOCK:
                cached = self.__dict__.get("_row_cache")
                if cached is None or cached[0] != version:
                    weights = (RowProduct(ssru.W.weight), RowProduct(ssru.Wf.weight, ssru.Wf.bias),
                               *(t.detach() for t in sources[11:13]),
                               RowProduct(cross.q.weight, cross.q.bias), RowProduct(cross.out.weight, cross.out.bias),
                               *(t.detach() for t in sources[13:15]),
                               RowProduct(mlp.fc_in.weight, mlp.fc_in.bias), RowProduct(mlp.fc_out.weight, mlp.fc_out.bias),
                               *(t.detach() for t in sources[15:17]))
                    cached = (version, weights)
                    self.__dict__["_row_cache"] = cached
        return cached[1]

    def lay_out(self, past: dict):
        """Lays this block out once per decoding for `step_row` from the encoder K/V (B = 1) in
        `past["memory"]`: K^T (h, dh, S), scaled by 1/sqrt(d_head), and V (h, S, dh), so that a
        step's cross-attention is two batched products, and the weights `step_row` reads
        (`row_weights`) as one tuple in the per-call `past` (no module attribute look-ups per step;
        the shared model is not touched)."""
        k, v = past["memory"]
        # the scale folded into K^T once per decoding (one multiply less per step; the scores
        # differ from scaling after the product by float rounding only)
        past["kT"] = k[0].transpose(-2, -1).mul(1.0 / math.sqrt(self.cross.d_head)).contiguous()
        past["vr"] = v[0].contiguous()
        past["row"] = self._row_tuple()

    def row_past(self, memory) -> dict:
        """`lay_out`'s per-call state projected straight from the encoder output `memory` (1, S, d):
        K and V as one product (S, 2 h dh), then K^T (h, dh, S) and V (h, S, dh) copied out of it --
        the same numbers as projecting each into its layout, in fewer, larger products."""
        cross = self.cross
        h, dh, S = cross.n_kv, cross.d_head, memory.shape[1]
        kv = cross.kv(memory[0])                                                           # (S, 2 h dh)
        k_t = kv[:, :h * dh].t().contiguous().mul_(1.0 / math.sqrt(dh))                    # (h dh, S)
        v = kv[:, h * dh:].view(S, h, dh).transpose(0, 1).contiguous()                     # (h, S, dh)
        return {"kT": k_t.view(h, dh, S), "vr": v, "row": self._row_tuple()}

    def _row_tuple(self) -> tuple:
        cross = self.cross
        return (*self.row_weights(), (cross.n_heads, 1, cross.d_head), self.norm_ssru.eps)

    def step_row(self, x, past: dict, into=None, head_mask=None, head_fill=None):
        """`forward` for one row without module dispatch (greedy decoding's fast path): x (1, d),
        past["c"] the SSRU cell (advanced), past["kT"] / past["vr"] the encoder K/V and past["row"]
        the weights (`lay_out`, `row_past`); the cross-attention weights (h, 1, S) are written into `into` when
        given. -> x (1, d). The same operations as `forward`, in place where nothing else reads."""
        (ssru_w, ssru_f, g_ssru, n_ssru, q, out, g_cross, n_cross, fc_in, fc_out, g_ffn, n_ffn,
         heads, eps) = past["row"]
        norm, d = torch.layer_norm, (x.shape[-1],)   # the functional wrapper adds ~2 us a call here
        wx, f = ssru_w(x), ssru_f(x).sigmoid_()                                    # (1, d) each
        c = past.get("c")
        # f * c + (1 - f) * wx as one lerp (wx + f * (c - wx)): the same cell up to float rounding
        c = past["c"] = torch.rsub(f, 1).mul_(wx) if c is None else torch.lerp(wx, c, f)
        x = norm(torch.relu(c).add_(x), d, g_ssru, n_ssru, eps)
        att = torch.bmm(q(x).view(heads), past["kT"])                            # (h, 1, S), scaled K^T
        att = torch.softmax(att, dim=-1) if into is None else torch.softmax(att, dim=-1, out=into)
        y = torch.bmm(att, past["vr"])                                           # (h, 1, dh)
        if head_mask is not None:
            y = y * head_mask.to(y.dtype)[:, None, None]
        if head_fill is not None:
            y = y + head_fill.to(y.dtype)[:, None, :]
        x = norm(out(y.view(1, -1)).add_(x), d, g_cross, n_cross, eps)
        h = fc_out(fc_in(x).relu_())
        return norm(h.add_(x), d, g_ffn, n_ffn, eps)
