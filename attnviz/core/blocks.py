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

from attnviz.core.attention import SOFTMAX, Variant, attend
from attnviz.core.config import Config
from attnviz.core.layers import (ACTIVATIONS, MLP, Experts, HeadsRMSNorm, LayerScale, Linear, RMSNorm, frozen,
                                 make_norm)
from attnviz.core.positional import alibi_slopes, apply_rope, disentangled_terms, relative_bias
from attnviz.core.scored import Scored

__all__ = ["ACTIVATIONS", "Attention", "Block", "BlockStep", "Linear", "MLP", "RMSNorm", "iter_layers", "make_norm"]

class Attention(nn.Module):
    """THE attention module: multi-head attention with grouped K/V heads, one fused QKV projection
    (`fused=True`) or a query projection `q` and a K/V one `kv` (`fused=False`: cross-attention,
    whose keys and values come from another source, the encoder's output; see `keys_values`).

    `heads` are the ORIGINAL indices of the query heads this layer holds (all of them unless
    pruned); `kv_of_head[i]` is the local K/V head that query head i reads.
    """

    def __init__(self, cfg: Config, heads: list[int] | None = None, kv_heads: list[int] | None = None,
                 fused: bool = True, layer: int = 0, source_width: int | None = None):
        super().__init__()
        # how this layer scores: the config's structural fields, read once here and nowhere else
        self.scale = cfg.attn_scale or None            # None: 1/√d_head, the kernels' own default
        self.softcap, self.window = cfg.attn_softcap, cfg.window(layer)
        self.local_rope = bool(self.window and cfg.local_rope_theta)
        heads = list(range(cfg.n_heads)) if heads is None else list(heads)
        kv_heads = list(range(cfg.n_kv_heads)) if kv_heads is None else list(kv_heads)
        self.n_heads, self.n_kv, self.d_head = len(heads), len(kv_heads), cfg.d_head
        d, h, hkv = cfg.d_model, self.n_heads * cfg.d_head, self.n_kv * cfg.d_head
        self.q_norm = self.k_norm = self.q_rest = self.k_rest = None
        if cfg.qk_norm == "head":
            self.q_norm, self.k_norm = RMSNorm(cfg.d_head, cfg.norm_eps), RMSNorm(cfg.d_head, cfg.norm_eps)
        elif cfg.qk_norm == "all":
            self.q_norm = HeadsRMSNorm(self.n_heads, cfg.d_head, cfg.n_heads * cfg.d_head, cfg.norm_eps)
            self.k_norm = HeadsRMSNorm(self.n_kv, cfg.d_head, cfg.n_kv_heads * cfg.d_head, cfg.norm_eps)
            # the heads pruning dropped still count in the layer-wide norm: their Q and K rows stay here
            q_rest, k_rest = cfg.n_heads * cfg.d_head - h, cfg.n_kv_heads * cfg.d_head - hkv
            self.q_rest = Linear(d, q_rest, bias=cfg.qkv_bias) if q_rest else None
            self.k_rest = Linear(d, k_rest, bias=cfg.qkv_bias) if k_rest else None
        if fused:
            self.qkv = Linear(d, h + 2 * hkv, bias=cfg.qkv_bias)
        else:
            # `source_width`: keys and values read another width than the queries (BLIP's text over a wider image)
            self.q, self.kv = Linear(d, h, bias=cfg.qkv_bias), Linear(source_width or d, 2 * hkv, bias=cfg.qkv_bias)
        self.fused = fused
        self.out = Linear(self.n_heads * cfg.d_head, d, bias=cfg.out_bias)
        # Buffers are built on the CPU explicitly: `Transformer.from_state` constructs on "meta".
        self.register_buffer("heads", torch.tensor(heads, dtype=torch.long, device="cpu"), persistent=False)
        kv_local = {kv: i for i, kv in enumerate(kv_heads)}
        kv_of_head = [kv_local[h // cfg.group] for h in heads]
        self.register_buffer("kv_of_head", torch.tensor(kv_of_head, dtype=torch.long, device="cpu"),
                             persistent=False)
        # ALiBi: each head's slope, by its ORIGINAL index (a pruned layer keeps its heads' own slopes)
        slopes = alibi_slopes(cfg.n_heads, device="cpu")[heads] if cfg.positional == "alibi" else None
        self.register_buffer("slopes", slopes, persistent=False)
        # DeBERTa's position terms: the position embeddings through the layer's own Q / K projections,
        # or through projections of their own (rows per head, pruned with the heads)
        self.terms, self.rel_shared_proj = cfg.disentangled, cfg.rel_shared_proj
        own = cfg.disentangled and not cfg.rel_shared_proj
        self.pos_q = Linear(d, h) if own and "p2c" in cfg.disentangled else None
        self.pos_k = Linear(d, h) if own and "c2p" in cfg.disentangled else None
        # BEiT: a learned bias per head by 2-D patch offset, on the trained grid (columns: this layer's heads)
        self.trained_grid = (cfg.grid, cfg.grid)
        self.rel_bias = (nn.Parameter(torch.zeros((2 * cfg.grid - 1) ** 2 + 3, self.n_heads))
                         if cfg.rel_pos_bias else None)
        # Uniform grouping lets the fused kernel handle GQA; a pruned, uneven one indexes K/V explicitly.
        self.uniform_groups = (self.n_kv > 0 and self.n_heads % self.n_kv == 0 and
                               kv_of_head == [i // (self.n_heads // self.n_kv) for i in range(self.n_heads)])

    def forward(self, x, *, rope=None, allowed=None, causal=False, head_mask=None,
                need_weights=False, variant: Variant = SOFTMAX, heads_out=None, head_fill=None, past=None,
                kv=None, patch=None, rope_local=None, position_bias=None, rel_pos=None, rel_grid=None):
        """`past`: this layer's K/V cache, a dict ("k", "v": (B, hkv, S, dh), rope applied) that is
        extended in place (incremental decoding); `kv`: keys and values computed once from another
        source (`keys_values`: cross-attention), then only the queries come from x; `heads_out`: a
        list the per-head outputs (B, h, T, dh), before the output projection, are appended to
        (logit attribution); `head_fill` [H, dh]: added to each head's output after the mask
        (mean ablation); `patch(name, t) -> t`: this call's edit of "q" (B, h, T, dh), "k" and "v"
        (B, hkv, T, dh, rope applied) and "z" (the per-head outputs, after mask and fill):
        activation patching, never a change to the module; `position_bias` (1, H, T, S): every
        original head's score bias from relative positions, computed once for all layers (MPNet's,
        T5's); `rel_pos`: the relative-position embeddings and each query-key pair's row of them
        (DeBERTa)."""
        B, T, _ = x.shape
        if self.n_heads == 0:  # every head of this layer pruned: the layer adds only the output bias
            return self.out(x.new_zeros(B, T, 0)), None
        if kv is not None:
            q, (k, v) = self.queries(x), kv
        else:
            q, k, v = self.project(x, rope_local if self.local_rope else rope)
        if patch is not None:
            q, k, v = patch("q", q), patch("k", k), patch("v", v)
        if past is not None and kv is None:  # the keys and values of the tokens before these, then these
            if "k" in past:
                k, v = torch.cat([past["k"], k], 2), torch.cat([past["v"], v], 2)  # (B, hkv, S, dh)
            past["k"], past["v"] = k, v
        bias = self.score_bias(k.shape[2], position_bias, rel_grid)
        if self.terms and rel_pos is not None:
            bias = sum(self.position_terms(q, k, rel_pos).values())
        if not self.uniform_groups:
            k, v = k[:, self.kv_of_head], v[:, self.kv_of_head]
        y, att = attend(q, k, v, causal=causal, allowed=allowed, variant=variant, need_weights=need_weights,
                        training=self.training, scale=self.scale, window=self.window, softcap=self.softcap,
                        bias=bias)
        if head_mask is not None:  # multiplies each head's output before the output projection
            # [H] one mask for every row, or [B, H] a mask per batch row (several masks in one pass)
            y = y * head_mask[..., self.heads].to(y.dtype).reshape(-1, self.n_heads, 1, 1)
        if head_fill is not None:  # [H, dh] or [B, H, dh], as the mask
            y = y + head_fill[..., self.heads, :].to(y.dtype).reshape(-1, self.n_heads, 1, self.d_head)
        if patch is not None:
            y = patch("z", y)
        if heads_out is not None:
            heads_out.append(y)
        y = y.transpose(1, 2).reshape(B, T, -1)      # (B, T, h*dh)
        return self.out(y), att

    def score_bias(self, S: int, position_bias=None, rel_grid=None):
        """What each of this layer's heads adds to its scaled scores: ALiBi's slope · key position
        (1, h, 1, S), the keys at positions 0..S-1 (a cached prefix's included), as BLOOM builds it
        (softmax ignores the part that is constant along a row, so this is -slope · distance up to
        that); this layer's heads' rows of a relative-position bias (1, h, T, S) the model shares
        among its layers (MPNet); BEiT's own relative position bias on the patch grid `rel_grid`
        (1, h, S, S); None without any."""
        if self.rel_bias is not None:
            if rel_grid is None:
                raise ValueError("a relative position bias needs the patch grid (Transformer.shared gives it)")
            return relative_bias(self.rel_bias, self.trained_grid, rel_grid)[None]
        if position_bias is not None:
            return position_bias[:, self.heads]
        if self.slopes is None:
            return None
        return (self.slopes[:, None, None] * torch.arange(S, device=self.slopes.device))[None]

    def position_terms(self, q, k, rel_pos) -> dict[str, torch.Tensor]:
        """DeBERTa's "c2p" and "p2c" terms of each head's scores (B, h, T, T), already scaled as
        the content score q·kᵀ is, so their sum is the bias the scores add."""
        emb, index = rel_pos                                    # (2·span, d), (T, T)
        P, h, dh = emb.shape[0], self.n_heads, self.d_head
        if self.rel_shared_proj:
            pq, pk, _ = self.qkv(emb).split([h * dh, self.n_kv * dh, self.n_kv * dh], dim=-1)
            pq, pk = (pq if "p2c" in self.terms else None), (pk if "c2p" in self.terms else None)
        else:
            pq = self.pos_q(emb) if self.pos_q is not None else None
            pk = self.pos_k(emb) if self.pos_k is not None else None
        heads = [None if t is None else t.view(P, -1, dh).transpose(0, 1) for t in (pq, pk)]  # (h, 2·span, dh)
        scale = self.scale or dh ** -0.5
        return {name: t * scale for name, t in disentangled_terms(q, k, *heads, index).items()}

    def queries(self, x):
        """x (B, T, d) -> q (B, h, T, dh) (an un-fused layer: the keys and values come from elsewhere)."""
        B, T, _ = x.shape
        return self.q(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)

    def keys_values(self, source):
        """source (B, S, d) -> k, v, each (B, hkv, S, dh): an un-fused layer's keys and values."""
        B, S, _ = source.shape
        k, v = self.kv(source).view(B, S, 2, self.n_kv, self.d_head).permute(2, 0, 3, 1, 4)
        return k, v

    def project(self, x, rope=None, steps: dict | None = None):
        """x (B, T, d) -> q (B, h, T, dh), k and v (B, hkv, T, dh) as scored: QK-norm, then RoPE
        on q and k. `steps` (a dict) receives the projections before either ("q_proj", "k_proj")
        and after the norm ("q_normed", "k_normed")."""
        B, T, _ = x.shape
        h, hkv, dh = self.n_heads, self.n_kv, self.d_head
        if not self.fused:
            q, (k, v) = self.queries(x), self.keys_values(x)
        else:
            q, k, v = self.qkv(x).split([h * dh, hkv * dh, hkv * dh], dim=-1)
            q = q.view(B, T, h, dh).transpose(1, 2)
            k, v = (t.view(B, T, hkv, dh).transpose(1, 2) for t in (k, v))
        if steps is not None:
            steps.update(q_proj=q, k_proj=k)
        if isinstance(self.q_norm, HeadsRMSNorm):  # over the layer's heads at once, dropped ones included
            q = self.q_norm(q, None if self.q_rest is None else self.q_rest(x))
            k = self.k_norm(k, None if self.k_rest is None else self.k_rest(x))
        elif self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.q_norm is not None and steps is not None:
            steps.update(q_normed=q, k_normed=k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return q, k, v

    def explain(self, x, *, rope=None, rope_local=None, allowed=None, causal=False, position_bias=None,
                rel_pos=None, rel_grid=None, **_) -> Scored:
        """What this layer computes for x (B, T, d), its input: the queries, keys and values as
        scored, with the scale, cap, window and mask it applies (see `Scored`), so analyses read
        the attention instead of rebuilding it."""
        steps: dict = {}
        rope = rope_local if self.local_rope else rope
        q, k, v = self.project(x, rope, steps)
        bias, parts = self.score_bias(k.shape[2], position_bias, rel_grid), None
        if self.terms and rel_pos is not None:
            parts = self.position_terms(q, k, rel_pos)
            bias = sum(parts.values())
        return Scored(x, q, k, v, self.kv_of_head, self.scale, self.softcap, self.window, causal, allowed,
                      rotated=rope is not None, bias=bias, bias_parts=parts, **steps)


class Block(nn.Module):
    """An encoder or decoder-only block. Post-norm (BERT): norm(x + f(x)). Pre-norm: x + f(norm(x)),
    each sub-layer's output optionally normed before the sum (`output_norms`: Gemma 2/3's sandwich,
    OLMo 2's output-only norms) and scaled (`layer_scale`); `parallel`: attention and MLP both
    read the block's input and add to it at once (GPT-NeoX, Phi, Falcon), through one shared norm
    or two. `head_parts` says how each head's output reaches the residual stream."""

    def __init__(self, cfg: Config, heads=None, kv_heads=None, layer: int = 0):
        super().__init__()
        self.pre_norm, self.parallel = cfg.pre_norm, cfg.parallel
        self.shared_norm, self.input_norms = cfg.shared_norm, cfg.input_norms
        self.norm1 = make_norm(cfg) if cfg.input_norms and (layer or cfg.first_input_norm) else None
        self.norm2 = make_norm(cfg) if cfg.input_norms and not cfg.shared_norm else None
        self.norm1_out = make_norm(cfg) if cfg.output_norms else None
        self.norm2_out = make_norm(cfg) if cfg.output_norms else None
        self.attn = Attention(cfg, heads, kv_heads, layer=layer)
        self.mlp = Experts(cfg) if cfg.n_experts else MLP(cfg)
        self.ls1 = LayerScale(cfg.d_model) if cfg.layer_scale else nn.Identity()
        self.ls2 = LayerScale(cfg.d_model) if cfg.layer_scale else nn.Identity()

    @property
    def additive(self) -> bool:
        """Whether the block's output is its input plus its parts (pre-norm), so each head's
        share of the residual stream is `head_parts`' (post-norm renormalises the sum)."""
        return self.pre_norm

    def attn_input(self, x):
        """What the attention reads: the block's input x, normed where the block norms it."""
        return self.norm1(x) if self.pre_norm and self.norm1 is not None else x

    def explain(self, x, **shared) -> Scored:
        """What this block's attention computes for x, the block's input (`Attention.explain`)."""
        return self.attn.explain(self.attn_input(x), **shared)

    def forward(self, x, **attn_kw):
        if not self.pre_norm:  # BERT: post-norm
            a, att = self.attn(x, **attn_kw)
            x = self.norm1(x + a)
            return self.norm2(x + self.mlp(x)), att
        h = self.attn_input(x)
        a, att = self.attn(h, **attn_kw)
        if self.norm1_out is not None:
            a = self.norm1_out(a)
        if self.parallel:
            m = self.mlp(h if self.shared_norm else self.norm2(x))
            return x + self.ls1(a) + self.ls2(m), att
        x = x + self.ls1(a)
        m = self.mlp(self.norm2(x) if self.norm2 is not None else x)
        if self.norm2_out is not None:
            m = self.norm2_out(m)
        return x + self.ls2(m), att

    def head_parts(self, z):
        """z (..., h, d_head), this block's per-head attention outputs at some positions -> (each
        head's share of what the attention adds to the residual stream (..., h, d), the constant
        rest (..., d)): the output projection's columns of each head, then an output norm frozen at
        the attention's actual output, then the layer scale. Their sum is exactly what the block
        adds from attention (a pre-norm block, `additive`)."""
        attn = self.attn
        W_O = attn.out.weight.float().view(-1, attn.n_heads, attn.d_head)      # (d, h, dh)
        per = torch.einsum("dhk,...hk->...hd", W_O, z.float())
        const = attn.out.bias.float() if attn.out.bias is not None else torch.zeros(W_O.shape[0])
        const = const.expand(per.shape[:-2] + const.shape)
        if self.norm1_out is not None:
            f, c, _ = frozen(self.norm1_out, per.sum(-2) + const)
            per, const = f(per.movedim(-2, 0)).movedim(0, -2), f(const) + c   # heads first: f broadcasts
        if isinstance(self.ls1, LayerScale):
            per, const = self.ls1(per), self.ls1(const)
        return per, const


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
    `head_mask` [L, H] (1 keeps a head), or [B, L, H]: a mask per batch row (the same text under
    several masks in one pass, each weight read serving every row); `capture`: layers whose weights to return; `weights_out`:
    {layer: tensor} (or one [L, ...] tensor) to write those layers' weights into; `variants`: a
    Variant for every layer, or {layer: Variant} for some; `check()` runs before every block (a
    deadline or a cancel); `head_outputs`: layers whose per-head outputs to return; `head_fill`
    [L, H, d_head] (or [B, L, H, d_head], as the mask): added to the heads' outputs after the mask (mean ablation); `cache`: one dict
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
        mask = None if head_mask is None else head_mask[i] if head_mask.dim() == 2 else head_mask[:, i]
        fill = None if head_fill is None else head_fill[i] if head_fill.dim() == 3 else head_fill[:, i]
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
