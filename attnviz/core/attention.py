"""Scaled dot-product attention, written out, plus its masks and variants.

Two paths side by side, as in nanoGPT: `attend` with `need_weights=True` runs the five steps
(scores, scale, mask, softmax, weighted sum) and returns the weights; without weights the
softmax variant goes through the fused `F.scaled_dot_product_attention`. Variants (local window,
chunked exact, linear elu+1, ReLU, top-k, temperature, dropout) share one entry point so the model,
the lab and the latency bench all swap them the same way. Attention dropout acts only in training
(`attend(training=True)`, which `Attention` passes from its module's mode): a trained model's
evaluation and every trace see the same weights as without it. Without weights, each variant takes its cheap
path: chunked holds (chunk, S) scores at a time, local scores only its band (O(T * window)), linear
never forms (T, S) (causal in blocks). 'eager' forces the written-out path, to measure it.

Shapes: q (B, h, T, dh); k, v (B, h_kv, S, dh) with h a multiple of h_kv (grouped-query
attention); `allowed` a bool mask broadcastable to (B, h, T, S), True where a query may look.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

KINDS = ("softmax", "local", "chunked", "linear", "relu", "topk")


@dataclass(frozen=True)
class Variant:
    kind: str = "softmax"
    window: int = 0            # local: keys within `window` positions of the query
    chunk: int = 256           # chunked: queries per block
    top_k: int = 0             # topk: keys kept per query
    temperature: float = 1.0   # divides the scaled scores (softmax, local, topk)
    fused: bool = True         # softmax: False runs the written-out five steps ('eager') even without weights
    dropout: float = 0.0       # training only: each weight zeroed with this probability, the rest scaled up

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown attention variant {self.kind!r}; choose one of {', '.join(KINDS)}")
        if self.kind == "local" and self.window < 1:
            raise ValueError("local attention needs a window of at least 1 token, e.g. 'local:64'")
        if self.kind == "chunked" and self.chunk < 1:
            raise ValueError("chunked attention needs a chunk of at least 1 query, e.g. 'chunked:128'")
        if self.kind == "topk" and self.top_k < 1:
            raise ValueError("top-k attention needs k of at least 1, e.g. 'topk:8'")
        if not self.temperature > 0:
            raise ValueError("temperature must be positive")
        if not 0 <= self.dropout < 1:
            raise ValueError("attention dropout must lie in [0, 1), e.g. 'dropout:0.1'")

    @property
    def name(self) -> str:
        """The one name of this variant in the UI, CSVs and the cost model: 'fused' (the softmax
        kernel), 'eager' (the written-out softmax), 'local:64', 'chunked:256', 'topk:8', 'linear',
        'relu', with '@T=2' for a temperature and '@drop=0.1' for dropout. `parse_variant(v.name) == v`."""
        if self.kind == "softmax":
            text = "fused" if self.fused else "eager"
        else:
            extra = {"local": self.window, "chunked": self.chunk, "topk": self.top_k}.get(self.kind)
            text = self.kind if extra is None else f"{self.kind}:{extra}"
        for tag, value, plain in (("T", self.temperature, 1.0), ("drop", self.dropout, 0.0)):
            if value != plain:
                t = f"{value:g}"
                text += f"@{tag}={t if float(t) == value else repr(value)}"
        return text

    label = name  # the same name under its older spelling


SOFTMAX = Variant()
EAGER = Variant(fused=False)


def parse_variant(spec: "str | Variant | None") -> Variant:
    """'softmax' / 'eager' / 'fused', 'local:64', 'chunked:128', 'linear', 'relu', 'topk:8', 'temp:2',
    'dropout:0.1'; a name's suffixes '@T=2' (temperature) and '@drop=0.1' (dropout) as well."""
    if spec is None:
        return SOFTMAX
    if isinstance(spec, Variant):
        return spec
    text, *suffixes = str(spec).strip().lower().split("@")
    if suffixes:  # a name's temperature / dropout suffixes
        variant, given = parse_variant(text), set()
        for suffix in suffixes:
            tag, _, value = suffix.partition("=")
            field = {"t": "temperature", "drop": "dropout"}.get(tag.strip())
            if field is None:
                raise ValueError(f"attention variant {spec!r}: unknown suffix @{suffix}; use @T=2 or @drop=0.1")
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"attention variant {spec!r}: {value!r} is not a number") from None
            if field in given or getattr(variant, field) != getattr(SOFTMAX, field):
                raise ValueError(f"attention variant {spec!r} gives its {field} twice")
            given.add(field)
            variant = replace(variant, **{field: number})
        return variant
    name, _, arg = text.partition(":")
    try:
        if name == "eager":  # the explicit path: materialises the (T, S) weights, then drops them
            return EAGER
        if name in ("softmax", "fused", ""):
            return SOFTMAX
        if name == "local":
            return Variant("local", window=int(arg or 64))
        if name == "chunked":
            return Variant("chunked", chunk=int(arg or 256))
        if name == "topk":
            return Variant("topk", top_k=int(arg or 8))
        if name in ("temp", "temperature"):
            return Variant("softmax", temperature=float(arg or 1.0))
        if name == "dropout":
            return Variant("softmax", dropout=float(arg or 0.1))
        if name in ("linear", "relu"):
            return Variant(name)
    except ValueError as err:
        if "could not convert" in str(err) or "invalid literal" in str(err):
            raise ValueError(f"attention variant {spec!r}: {arg!r} is not a number") from None
        raise
    raise ValueError(f"unknown attention variant {spec!r}; choose one of "
                     "softmax (= fused), eager, local:W, chunked:C, linear, relu, topk:K, temp:T, dropout:P")


# ---------------------------------------------------------------- masks

def causal_mask(T: int, S: int | None = None, device=None) -> torch.Tensor:
    """(T, S) bool; query i sees keys j <= i + (S - T) (keys may include a cached prefix)."""
    S = T if S is None else S
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)


def local_mask(T: int, window: int, causal: bool, device=None, S: int | None = None) -> torch.Tensor:
    """(T, S) bool; keys within `window` positions of the query (only earlier ones when causal).
    With S > T the queries are the last T of S positions (keys include a cached prefix)."""
    S = T if S is None else S
    dist = (torch.arange(S - T, S, device=device)[:, None] - torch.arange(S, device=device)[None, :])
    return (dist >= 0) & (dist < window) if causal else dist.abs() < window


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) 1/0 keep mask -> (B, 1, 1, S) bool."""
    return attention_mask.bool()[:, None, None, :]


def combine(*masks: "torch.Tensor | None") -> "torch.Tensor | None":
    out = None
    for m in masks:
        if m is not None:
            out = m if out is None else out & m
    return out


# ---------------------------------------------------------------- attention

def _expand_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    # (B, h_kv, S, dh) -> (B, h_kv*group, S, dh); each K/V head serves `group` query heads
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def scores(q, k, scale=None, temperature=1.0, softcap=0.0, bias=None):
    """q k^T scaled (then soft-capped: cap * tanh(s / cap), Gemma 2), plus a score bias (ALiBi:
    (.., h, 1, S), added as BLOOM adds it, after the scale) and divided by the temperature: the
    logits the softmax reads, before the mask. (B, h, T, S)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if not softcap and bias is None:
        return torch.matmul(q, k.transpose(-2, -1)).mul_(scale / temperature)
    att = torch.matmul(q, k.transpose(-2, -1)).mul_(scale)
    if softcap:
        att = torch.tanh(att.div_(softcap)).mul_(softcap)
    if bias is not None:
        att = att + bias.to(att.dtype)
    return att if temperature == 1.0 else att.div_(temperature)


def softmax_weights(q, k, allowed=None, scale=None, temperature=1.0, top_k=0, out=None, softcap=0.0, bias=None):
    """The written-out path: scores = q k^T, scaled, biased, masked, softmax. Returns (B, h, T, S),
    written into `out` when given (a slice of the trace's [L, H, n, n] tensor: no copy later)."""
    att = scores(q, k, scale, temperature, softcap, bias)  # (B, h, T, S)
    if allowed is not None:
        att.masked_fill_(~allowed, float("-inf"))
    if top_k and top_k < att.shape[-1]:
        kth = att.topk(top_k, dim=-1).values[..., -1:]
        att.masked_fill_(att < kth, float("-inf"))
    att = torch.softmax(att, dim=-1) if out is None else torch.softmax(att, dim=-1, out=out)
    if allowed is not None:  # a query that may see no key gets zero weights (as the fused kernel), not NaN
        blind = ~allowed.any(-1, keepdim=True)
        if blind.any():  # out of place: softmax's backward needs its output untouched
            att = att.masked_fill(blind, 0.0)
    return att


def _feature(x):
    return F.elu(x) + 1.0  # Katharopoulos et al. 2020: a positive feature map


def linear_weights(q, k, allowed=None):
    """The explicit quadratic form of linear attention: phi(q) phi(k)^T, row-normalised."""
    att = torch.matmul(_feature(q), _feature(k).transpose(-2, -1))
    if allowed is not None:
        att = att.masked_fill(~allowed, 0.0)
    return att / att.sum(-1, keepdim=True).clamp_min(1e-12)


def relu_weights(q, k, allowed=None, scale=None, bias=None):
    """ReLU attention (Wortsman et al. 2023): relu(scaled scores) / number of visible keys."""
    att = torch.relu(scores(q, k, scale, bias=bias))
    if allowed is None:
        return att / att.shape[-1]
    att = att.masked_fill(~allowed, 0.0)
    return att / allowed.sum(-1, keepdim=True).clamp_min(1)


def _linear_fast(q, k, v, causal: bool, chunk: int = 64):
    """Linear attention without the (T, S) matrix: O(T dh dv) time, O(dh dv) state.

    Causal: blocks of `chunk` queries use the masked quadratic form inside the block and a running
    sum of phi(k)^T v over earlier blocks (memory O(chunk^2 + dh dv) instead of the O(T dh dv) that a
    plain cumulative sum of outer products needs)."""
    fq, fk = _feature(q), _feature(k)
    if not causal:
        kv = torch.matmul(fk.transpose(-2, -1), v)            # (B, h, dh, dv)
        z = fk.sum(-2)                                        # (B, h, dh)
        return torch.matmul(fq, kv) / (fq * z[..., None, :]).sum(-1, keepdim=True).clamp_min(1e-12)
    B, h, T, dh = fq.shape
    state = fq.new_zeros(B, h, dh, v.shape[-1])               # sum of phi(k)^T v over earlier blocks
    z = fq.new_zeros(B, h, 1, dh)                             # sum of phi(k) over earlier blocks
    out = fq.new_empty(B, h, T, v.shape[-1])
    tri = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    for start in range(0, T, chunk):
        stop = min(start + chunk, T)
        qb, kb, vb = fq[..., start:stop, :], fk[..., start:stop, :], v[..., start:stop, :]
        att = torch.matmul(qb, kb.transpose(-2, -1))          # (B, h, c, c) inside the block
        att = att.masked_fill(~tri[: stop - start, : stop - start], 0.0)
        num = torch.matmul(qb, state) + torch.matmul(att, vb)
        den = (qb * z).sum(-1, keepdim=True) + att.sum(-1, keepdim=True)
        out[..., start:stop, :] = num / den.clamp_min(1e-12)
        state = state + torch.matmul(kb.transpose(-2, -1), vb)
        z = z + kb.sum(-2, keepdim=True)
    return out


def chunked_attention(q, k, v, chunk: int, allowed=None, causal=False, scale=None):
    """Exact softmax attention over query blocks: peak memory O(T * chunk) instead of O(T^2).

    k, v may hold fewer (grouped) heads than q. The causal mask is built per block, never whole."""
    T, S = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    gqa = q.shape[1] != k.shape[1]
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    for start in range(0, T, chunk):
        stop = min(start + chunk, T)
        block_allowed = allowed
        if allowed is not None and allowed.shape[-2] == T:  # a (.., 1, S) padding mask broadcasts as is
            block_allowed = allowed[..., start:stop, :]
        if causal:
            rows = torch.arange(start, stop, device=q.device)[:, None] + (S - T)
            c = torch.arange(S, device=q.device)[None, :] <= rows   # (chunk, S)
            block_allowed = combine(block_allowed, c)
        out[..., start:stop, :] = F.scaled_dot_product_attention(
            q[..., start:stop, :], k, v, attn_mask=block_allowed, scale=scale, enable_gqa=gqa)
    return out


def local_attention(q, k, v, window: int, causal=False, scale=None, temperature=1.0):
    """Exact sliding-window softmax attention computed block by block: O(T * window) time and memory.

    Queries go in blocks of `window` (at least 32, to keep the Python loop short); a block only
    scores the keys that any of its queries may see, so nothing outside the band is computed."""
    T = q.shape[-2]
    scale = (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale) / temperature
    gqa = q.shape[1] != k.shape[1]
    block = max(window, 32)
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    for start in range(0, T, block):
        stop = min(start + block, T)
        k_start = max(0, start - window + 1)
        k_stop = stop if causal else min(T, stop + window - 1)
        dist = (torch.arange(start, stop, device=q.device)[:, None]
                - torch.arange(k_start, k_stop, device=q.device)[None, :])   # (block, keys)
        near = (dist >= 0) & (dist < window) if causal else dist.abs() < window
        out[..., start:stop, :] = F.scaled_dot_product_attention(
            q[..., start:stop, :], k[..., k_start:k_stop, :], v[..., k_start:k_stop, :],
            attn_mask=near, scale=scale, enable_gqa=gqa)
    return out


def _biased(q, k, v, causal, allowed, variant: Variant, s, bias):
    """The fused kernel with a score bias (ALiBi) as its float mask: the bias where a key may be
    seen, -inf elsewhere; None (the explicit path) for the other variants and for a query that may
    see no key (the explicit path gives it zero weights)."""
    if variant.kind not in ("softmax", "local") or not variant.fused:
        return None
    T, S = q.shape[-2], k.shape[-2]
    seen = combine(allowed, causal_mask(T, S, q.device) if causal else None,
                   local_mask(T, variant.window, causal, q.device, S) if variant.kind == "local" else None)
    mask = bias.to(q.dtype) / variant.temperature
    if allowed is not None and not bool(seen.any(-1).all()):  # causal and window masks keep the diagonal
        return None
    if seen is not None:
        mask = mask.masked_fill(~seen, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=s, enable_gqa=q.shape[1] != k.shape[1])


def _fast(q, k, v, causal, allowed, variant: Variant, scale, bias=None):
    """The paths that never hold a (T, S) matrix, or None when this case needs the explicit one."""
    kind, group = variant.kind, q.shape[1] // k.shape[1]
    T, S = q.shape[-2], k.shape[-2]
    if kind == "local" and T != S:  # queries after a cached prefix: the band, offset
        allowed = combine(allowed, local_mask(T, variant.window, causal, q.device, S))
    s = (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale) / variant.temperature
    if bias is not None:
        return _biased(q, k, v, causal, allowed, variant, s, bias)
    if kind == "chunked":
        return chunked_attention(q, k, v, variant.chunk, allowed, causal, s)
    if kind == "linear" and allowed is None and T == S:
        return _linear_fast(q, _expand_kv(k, group), _expand_kv(v, group), causal)
    if kind == "local" and T == S:
        if allowed is None:
            return local_attention(q, k, v, variant.window, causal, scale, variant.temperature)
        allowed, causal = combine(allowed, local_mask(T, variant.window, causal, q.device)), False
    if kind == "local" or (kind == "softmax" and variant.fused):
        if causal and T == 1:  # one new query after its cached prefix sees every key
            causal = False
        # is_causal ignores attn_mask's presence, and aligns top-left when T < S (a cached prefix):
        # join the bottom-right causal mask here
        if causal and (allowed is not None or T != S):
            allowed, causal = combine(allowed, causal_mask(T, S, q.device)), False
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=causal,
                                              scale=s, enable_gqa=group > 1)
    return None


def with_window(variant: Variant, window: int, T: int, S: int) -> tuple[Variant, int]:
    """A layer's own window (Mistral, Gemma's local layers) joined with the variant's: (the
    variant to run, the window left to apply as a mask). Softmax in a window is the local variant."""
    if not window:
        return variant, 0
    if variant.kind == "local":
        return replace(variant, window=min(variant.window, window)), 0
    if variant.kind == "softmax" and variant.fused and T == S:
        return replace(variant, kind="local", window=window), 0
    return variant, window


def attend(q, k, v, *, causal=False, allowed=None, variant: Variant = SOFTMAX, need_weights=False,
           scale=None, training: bool = False, window: int = 0, softcap: float = 0.0, bias=None):
    """Attention for one layer. Returns (out (B, h, T, dv), weights (B, h, T, S) or None).
    `need_weights` may be a (B, h, T, S) tensor: the weights are then written into it.
    `training`: the variant's dropout applies (on the written-out weights; the weights returned
    are those before dropout, rows summing to 1). `window`: the layer's own sliding window (keys
    within that many positions, joined with the variant's); `softcap`: the scores' soft cap;
    `bias`: a float score bias broadcastable to (B, h, T, S), added after the scale (ALiBi)."""
    into = need_weights if isinstance(need_weights, torch.Tensor) else None
    drop = variant.dropout if training else 0.0
    T, S = q.shape[-2], k.shape[-2]
    variant, window = with_window(variant, window, T, S)
    if window:
        allowed = combine(allowed, local_mask(T, window, causal, q.device, S))
    if bias is not None and variant.kind == "linear":
        raise ValueError("linear attention has no scores to add a position bias (ALiBi) to; "
                         "pick another attention variant")
    if into is None and not need_weights and not drop and not softcap:
        out = _fast(q, k, v, causal, allowed, variant, scale, bias)
        if out is not None:
            return out, None
    group = q.shape[1] // k.shape[1]
    kind = variant.kind
    if kind == "local":
        allowed = combine(allowed, local_mask(T, variant.window, causal, q.device, S))
    elif causal:
        allowed = combine(allowed, causal_mask(T, S, q.device))
    k, v = _expand_kv(k, group), _expand_kv(v, group)
    if kind == "linear":
        att = linear_weights(q, k, allowed)
    elif kind == "relu":
        att = relu_weights(q, k, allowed, scale, bias)
    else:  # softmax (eager or with weights), local, chunked (with weights), topk
        att = softmax_weights(q, k, allowed, scale, variant.temperature, variant.top_k, out=into, softcap=softcap,
                              bias=bias)
    if into is not None and att is not into:
        att = into.copy_(att)
    used = F.dropout(att, drop, training=True) if drop else att
    return torch.matmul(used, v), (att if into is not None or need_weights else None)
