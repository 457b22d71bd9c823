"""One config-driven transformer for five families: BERT, GPT-2, Llama, ViT, DINOv2.

Leaf modules first (norm, attention, MLP), then the block, then the model. Capture of attention
weights, head masks and attention variants are arguments of `forward`, never state: one loaded
model serves every caller at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnviz.core.attention import SOFTMAX, Variant, attend, padding_mask
from attnviz.core.base_model import adopt_state
from attnviz.core.config import Config
from attnviz.core.positional import apply_rope, interpolate_grid, rope_cos_sin, sinusoidal

ROPE_CACHE_MAX = 8192  # positions precomputed; longer inputs compute their table on the fly

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
    through `.data` bypass PyTorch's change counter: call `pack()` again after those."""

    _packed = None
    _packed_version = -1

    def pack(self, rows_hint: int = 128) -> bool:
        if self.weight.numel() == 0 or self.weight.dtype != torch.float32 or self.weight.is_meta:
            return False
        try:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), rows_hint)
        except (RuntimeError, AttributeError):  # no oneDNN in this build (some aarch64 wheels)
            self._packed = None
            return False
        self._packed_version = _version(self.weight)
        return True

    def _use_packed(self, x) -> bool:
        return (self._packed is not None and not torch.is_grad_enabled() and x.dtype == torch.float32
                and _version(self.weight) == self._packed_version)

    def forward(self, x, act: str = "none"):
        """`act`: "gelu" or "gelu_tanh" fuses that activation into the product on the packed path."""
        if self._use_packed(x):
            algorithm = "tanh" if act == "gelu_tanh" else "none"
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._packed, self.bias,
                                                      "none" if act == "none" else "gelu", [], algorithm)
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
    """Multi-head attention with grouped K/V heads and one fused QKV projection.

    `heads` are the ORIGINAL indices of the query heads this layer holds (all of them unless
    pruned); `kv_of_head[i]` is the local K/V head that query head i reads.
    """

    def __init__(self, cfg: Config, heads: list[int] | None = None, kv_heads: list[int] | None = None):
        super().__init__()
        heads = list(range(cfg.n_heads)) if heads is None else list(heads)
        kv_heads = list(range(cfg.n_kv_heads)) if kv_heads is None else list(kv_heads)
        self.n_heads, self.n_kv, self.d_head = len(heads), len(kv_heads), cfg.d_head
        d = cfg.d_model
        self.qkv = Linear(d, (self.n_heads + 2 * self.n_kv) * cfg.d_head, bias=cfg.qkv_bias)
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
                need_weights=False, variant: Variant = SOFTMAX, heads_out=None, head_fill=None, past=None):
        """`past`: this layer's K/V cache, a dict ("k", "v": (B, hkv, S, dh), rope applied) that is
        extended in place (incremental decoding); `heads_out`: a list the per-head outputs
        (B, h, T, dh), before the output projection, are appended to (logit attribution);
        `head_fill` [H, dh]: added to each head's output after the mask (mean ablation)."""
        B, T, _ = x.shape
        if self.n_heads == 0:  # every head of this layer pruned: the layer adds only the output bias
            return self.out(x.new_zeros(B, T, 0)), None
        q, k, v = self.project(x, rope)
        if past is not None:  # the keys and values of the tokens before these, then these
            if "k" in past:
                k, v = torch.cat([past["k"], k], 2), torch.cat([past["v"], v], 2)  # (B, hkv, S, dh)
            past["k"], past["v"] = k, v
        if not self.uniform_groups:
            k, v = k[:, self.kv_of_head], v[:, self.kv_of_head]
        y, att = attend(q, k, v, causal=causal, allowed=allowed, variant=variant, need_weights=need_weights)
        if head_mask is not None:  # multiplies each head's output before the output projection
            y = y * head_mask[self.heads].to(y.dtype)[None, :, None, None]
        if head_fill is not None:
            y = y + head_fill[self.heads].to(y.dtype)[:, None, :][None]          # (1, h, 1, dh)
        if heads_out is not None:
            heads_out.append(y)
        y = y.transpose(1, 2).reshape(B, T, -1)      # (B, T, h*dh)
        return self.out(y), att

    def project(self, x, rope=None):
        """x (B, T, d) -> q (B, h, T, dh), k and v (B, hkv, T, dh); RoPE applied to q and k."""
        B, T, _ = x.shape
        h, hkv, dh = self.n_heads, self.n_kv, self.d_head
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
        if self.act_name in ("gelu", "gelu_tanh"):
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
class Output:
    hidden: torch.Tensor                       # (B, n, d_model), last_hidden_state
    logits: torch.Tensor | None                # (B, n, vocab) for language models
    attentions: dict[int, torch.Tensor]        # layer -> (B, h_layer, n, n), captured layers only
    states: list[torch.Tensor] | None = None   # input of every block, then the final hidden


@dataclass
class BlockStep:
    """One step of the forward loop (`Transformer.iter_blocks`)."""
    layer: int
    x: torch.Tensor                            # (B, n, d_model) the block's input
    out: torch.Tensor                          # (B, n, d_model) its output
    weights: torch.Tensor | None               # (B, h_layer, n, n) when this layer was captured
    heads: torch.Tensor | None = None          # (B, h_layer, n, d_head) per-head outputs, when asked


@dataclass
class Blocks:
    """What `Transformer.run_blocks` returns."""
    x: torch.Tensor                            # (B, n, d_model) output of the last block run (not normed)
    weights: dict[int, torch.Tensor]           # layer -> (B, h_layer, n, n), captured layers only
    states: list[torch.Tensor] | None = None   # (B, n, d_model) input of every block run, when asked


def sentence_embedding(hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The one pooling (sentence-transformers'): mean over the real tokens, then L2-normalised.
    hidden [..., n, d] -> [..., d]; attention_mask [..., n] (1 = real token) leaves out padding.
    Without a mask every token counts, special tokens included, as MiniLM is pooled."""
    if hidden.dim() < 2 or hidden.shape[-2] == 0:
        raise ValueError(f"hidden must be [..., n_tokens, d_model] with n >= 1, got {tuple(hidden.shape)}")
    h = hidden if hidden.dtype in (torch.float32, torch.float64) else hidden.float()
    if attention_mask is None:
        pooled = h.mean(-2)
    else:
        w = attention_mask.to(h.dtype)[..., None]                        # (..., n, 1)
        pooled = (h * w).sum(-2) / w.sum(-2).clamp_min(1)
    return F.normalize(pooled, dim=-1)


class Transformer(nn.Module):
    def __init__(self, cfg: Config, heads: list[list[int]] | None = None,
                 kv_heads: list[list[int]] | None = None):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        if cfg.is_vision:
            self.patch = nn.Conv2d(cfg.n_channels, d, cfg.patch_size, stride=cfg.patch_size)
            self.cls = nn.Parameter(torch.zeros(1, 1, d))
            self.pos = nn.Parameter(torch.zeros(1, 1 + cfg.grid ** 2, d))
            self.registers = nn.Parameter(torch.zeros(1, cfg.n_registers, d)) if cfg.n_registers else None
        else:
            self.tok = nn.Embedding(cfg.vocab_size, d)
            self.pos = nn.Embedding(cfg.max_positions, d) if cfg.positional == "learned" else None
            self.types = nn.Embedding(cfg.type_vocab_size, d) if cfg.type_vocab_size else None
        self.emb_norm = make_norm(cfg) if cfg.embedding_norm else None
        self.blocks = nn.ModuleList(
            Block(cfg, None if heads is None else heads[i], None if kv_heads is None else kv_heads[i])
            for i in range(cfg.n_layers))
        self.norm = make_norm(cfg) if cfg.final_norm else None
        self.lm_head = None
        if cfg.mlm_head:
            self.mlm_transform = Linear(d, d)
            self.mlm_norm = make_norm(cfg)
        if cfg.task == "lm" or cfg.mlm_head:
            self.lm_head = Linear(d, cfg.vocab_size, bias=cfg.mlm_head)
            if cfg.tie_embeddings:
                self.lm_head.weight = self.tok.weight
        if cfg.positional == "rotary":
            with torch.device("cpu"):
                cos, sin = rope_cos_sin(min(cfg.max_positions, ROPE_CACHE_MAX), cfg.d_head, cfg.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    @classmethod
    def from_state(cls, cfg: Config, state: dict, heads=None, kv_heads=None) -> "Transformer":
        """Build around existing tensors without random initialisation (no copy: the tensors are
        adopted). Raises ValueError when the tensors do not fit this config."""
        return adopt_state(lambda: cls(cfg, heads, kv_heads), state, tied=cfg.tie_embeddings)

    def pack(self) -> int:
        """Prepack every linear weight for inference (see `Linear`). Returns how many were packed."""
        return sum(m.pack() for m in self.modules() if isinstance(m, Linear))

    # ---------------------------------------------------------------- embeddings
    def embed_text(self, ids, token_type_ids=None, offset: int = 0):
        """`offset`: the position of the first id (tokens after a cached prefix)."""
        T = ids.shape[1]
        x = self.tok(ids)
        if self.pos is not None:
            x = x + self.pos.weight[offset:offset + T]
        elif self.cfg.positional == "sinusoidal":
            x = x + sinusoidal(offset + T, self.cfg.d_model)[offset:].to(x.dtype)
        if self.types is not None:
            types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids
            x = x + self.types(types)
        return self.emb_norm(x) if self.emb_norm is not None else x

    def embed_image(self, pixels):
        cfg = self.cfg
        B, _, H, W = pixels.shape
        x = self.patch(pixels).flatten(2).transpose(1, 2)  # (B, gh*gw, d)
        pos = self.pos
        grid_pos = interpolate_grid(pos[:, 1:], cfg.grid, H // cfg.patch_size, W // cfg.patch_size)
        x = torch.cat([self.cls.expand(B, -1, -1) + pos[:, :1], x + grid_pos], dim=1)
        if self.registers is not None:  # registers go after CLS and carry no position
            x = torch.cat([x[:, :1], self.registers.expand(B, -1, -1), x[:, 1:]], dim=1)
        return x

    def rope(self, T: int):
        if T <= self.rope_cos.shape[0]:
            return self.rope_cos[:T], self.rope_sin[:T]
        return rope_cos_sin(T, self.cfg.d_head, self.cfg.rope_theta)

    # ---------------------------------------------------------------- the forward loop
    def iter_blocks(self, x, start: int = 0, stop: int | None = None, *, head_mask=None, capture=(),
                    weights_out=None, variants=None, attention_mask=None, check=None,
                    head_outputs=(), head_fill=None, cache=None, offset: int = 0):
        """THE forward loop: blocks start..stop-1 from x = the input of block `start` (B, n, d),
        yielding a `BlockStep` per block (callers that look at one layer at a time, such as long
        captures and head scores, never hold every layer's weights).
        `head_mask` [L, H] (1 keeps a head); `capture`: layers whose weights to return;
        `weights_out`: {layer: (B, h, n, n) tensor} to write those layers' weights into;
        `variants`: a Variant for every layer, or {layer: Variant} for some; `attention_mask`
        (B, n): 1 for real tokens; `check()` runs before every block (a deadline or a cancel).
        `head_outputs`: layers whose per-head outputs to return (`BlockStep.heads`); `head_fill`
        [L, H, d_head]: added to the heads' outputs after the mask (mean ablation); `cache`: one
        dict per layer holding its keys and values (incremental decoding, see `Attention`), and
        `offset` the position of x's first token after what the cache holds."""
        cfg = self.cfg
        stop = cfg.n_layers if stop is None else int(stop)
        if not 0 <= start <= stop <= cfg.n_layers:
            raise ValueError(f"blocks {start}..{stop} are outside 0..{cfg.n_layers}")
        allowed = padding_mask(attention_mask) if attention_mask is not None else None
        rope = None
        if cfg.positional == "rotary":  # absolute positions offset..offset+n-1
            cos, sin = self.rope(offset + x.shape[1])
            rope = (cos[offset:], sin[offset:])
        head_outputs = set(head_outputs)
        capture = set(capture)
        per_layer = variants if isinstance(variants, dict) else {}
        default_variant = variants if isinstance(variants, Variant) else SOFTMAX
        for i in range(start, stop):
            if check is not None:
                check()
            z = [] if i in head_outputs else None
            out, att = self.blocks[i](x, rope=rope, allowed=allowed, causal=cfg.causal,
                                      head_mask=None if head_mask is None else head_mask[i],
                                      need_weights=weights_out[i] if weights_out and i in weights_out
                                      else i in capture, variant=per_layer.get(i, default_variant),
                                      heads_out=z, head_fill=None if head_fill is None else head_fill[i],
                                      past=None if cache is None else cache[i])
            yield BlockStep(i, x, out, att, z[0] if z else None)
            x = out
            del att

    def run_blocks(self, x, start: int = 0, stop: int | None = None, *, states: bool = False, **kw) -> Blocks:
        """`iter_blocks` run to the end: the last output, the captured weights and (`states`) every
        block's input. Masked reruns start at the first changed layer from a kept state."""
        weights, collected = {}, [] if states else None
        for step in self.iter_blocks(x, start, stop, **kw):
            if states:
                collected.append(step.x)
            if step.weights is not None:
                weights[step.layer] = step.weights
            x = step.out
        return Blocks(x, weights, collected)

    def finish(self, x, logits: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last block's output (B, n, d) -> (final hidden, logits or None): final norm and LM head."""
        if self.norm is not None:
            x = self.norm(x)
        if not logits or self.lm_head is None:
            return x, None
        h = self.mlm_norm(F.gelu(self.mlm_transform(x))) if self.cfg.mlm_head else x
        return x, self.lm_head(h)

    def forward(self, input_ids=None, pixel_values=None, *, token_type_ids=None, attention_mask=None,
                head_mask=None, need_weights=False, layers=None, variants=None, states=False, weights_out=None,
                logits=True, check=None, head_fill=None) -> Output:
        """`layers`: which layers' weights to capture (default all, when need_weights); the rest as
        in `iter_blocks`."""
        x = self.embed_image(pixel_values) if self.cfg.is_vision else self.embed_text(input_ids, token_type_ids)
        capture = (range(self.cfg.n_layers) if layers is None else layers) if need_weights else ()
        run = self.run_blocks(x, head_mask=head_mask, head_fill=head_fill, capture=capture, weights_out=weights_out,
                              variants=variants, attention_mask=attention_mask, states=states, check=check)
        hidden, out_logits = self.finish(run.x, logits)
        return Output(hidden, out_logits, run.weights, run.states + [hidden] if states else None)
