"""Encoder-decoder transformers: the Bergamot students (SSRU decoder) and HF Marian / BART.

Leaf modules first (positions, SSRU, multi-head attention with a separate K/V source), then the
two decoder layers, then `Seq2Seq` and its block runner: `encode` once, `start` a per-call
`DecoderState` (every layer's encoder K/V computed once), then `step` feeds only the new target
positions and carries the state (SSRU cell, or self-attention K/V). The encoder layers are the core
post-norm `Block`; every attention goes through `attnviz.core.attention.attend`. Head masks and
capture are arguments, never state: one loaded model serves every caller.

Cross-attention: queries from the decoder's current position, keys and values from the encoder's
output, so row t of a cross-attention map [T, S] says which source tokens the decoder read while
choosing target token t.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from attnviz.core.attention import attend
from attnviz.core.base_model import adopt_state
from attnviz.core.config import Config
from attnviz.core.transformer import MLP, Block, Linear

DECODERS = ("ssru", "attention")
POSITIONALS = ("marian", "hf_marian", "learned")


@dataclass(frozen=True)
class Seq2SeqConfig:
    family: str                  # the family that built it (a label: nothing branches on it)
    n_enc_layers: int
    n_dec_layers: int
    n_heads: int
    d_model: int
    d_ff: int
    vocab_size: int
    decoder: str = "attention"   # attention: self + cross (HF Marian, BART); ssru: Bergamot, no self-attention
    activation: str = "relu"     # relu | gelu | silu
    norm_eps: float = 1e-5
    positional: str = "marian"   # marian: sin|cos halves, frequency step ln(1e4)/(d/2-1); hf_marian: halves,
                                 # frequencies 1e4^(-2i/d) (transformers' Marian); learned: a table (BART)
    position_offset: int = 0     # BART's learned table starts at row 2 (a fairseq legacy)
    embed_scale: float = 1.0     # sqrt(d_model) for Marian
    embedding_norm: bool = False  # BART: LayerNorm after embeddings + positions
    zero_start: bool = False     # Bergamot: the first decoder input is a zero vector, not a token
    decoder_start_id: int = 0    # the start token otherwise (Marian: pad; BART: </s>)
    eos_id: int = 0
    pad_id: int = 0
    max_positions: int = 1024
    bias: bool = True            # attention projections carry biases (all three families do)
    pre_norm: bool = False       # Whisper: LayerNorm before each sublayer and after the last layer

    def __post_init__(self):
        if not isinstance(self.family, str) or not self.family:
            raise ValueError(f"family must be a non-empty name; got {self.family!r:.40}")
        if self.decoder not in DECODERS or self.positional not in POSITIONALS:
            raise ValueError(f"decoder must be one of {DECODERS}, positional one of {POSITIONALS}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def task(self) -> str:
        return "translation"

    def block_config(self) -> Config:
        """The core config the reused modules (`Block`, `MLP`) read: an encoder of this shape,
        post-norm (residual, then LayerNorm) unless `pre_norm`."""
        return Config(family=self.family, task="encoder", n_layers=self.n_enc_layers, n_heads=self.n_heads,
                      n_kv_heads=self.n_heads, d_model=self.d_model, d_head=self.d_head, d_ff=self.d_ff,
                      vocab_size=self.vocab_size, norm_eps=self.norm_eps, activation=self.activation,
                      qkv_bias=self.bias, out_bias=self.bias, positional="none", pre_norm=self.pre_norm)


def sinusoid_halves(n: int, d: int, offset: int = 0, marian: bool = True) -> torch.Tensor:
    """(n, d) positions offset..offset+n-1: sin of every frequency, then cos of every frequency.
    Marian's own step is ln(1e4)/(d/2 - 1); transformers' Marian uses 1e4^(-2i/d)."""
    half = d // 2
    i = torch.arange(half, dtype=torch.float64)
    freq = torch.exp(-i * math.log(10000.0) / (half - 1)) if marian else 10000.0 ** (-2 * i / d)
    angle = torch.arange(offset, offset + n, dtype=torch.float64)[:, None] * freq  # (n, d/2)
    return torch.cat([angle.sin(), angle.cos()], dim=-1).float()


class SSRU(nn.Module):
    """Simpler Simple Recurrent Unit (Kim et al. 2019), the Bergamot decoder's replacement for
    self-attention: f_t = sigmoid(x_t W_f + b_f), c_t = f_t * c_{t-1} + (1 - f_t) * (x_t W),
    out_t = relu(c_t). Only c carries the past: a step costs the same at every position."""

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

    def forward(self, x, c=None):
        """x (B, T, d), c (B, d) or None (zeros) -> (out (B, T, d), c after the last position)."""
        if torch.is_grad_enabled() or not self.plain():  # training (gradients reach W and W_f) or replaced layers
            wx, f = self.W(x), torch.sigmoid(self.Wf(x))
        else:
            wx, f = torch.nn.functional.linear(x, *self.fused()).chunk(2, dim=-1)   # (B, T, d) each
            f = torch.sigmoid(f)
        z = (1 - f) * wx                           # (B, T, d): the input's share of each step
        if x.shape[1] == 1:                        # one decoding step: no loop
            c = z[:, 0] if c is None else torch.addcmul(z[:, 0], f[:, 0], c)
            return torch.relu(c)[:, None], c
        out = torch.empty_like(z)
        for t in range(x.shape[1]):
            c = z[:, t] if c is None else torch.addcmul(z[:, t], f[:, t], c)
            out[:, t] = c
        return torch.relu(out), c


class MultiHeadAttention(nn.Module):
    """Q from the queries' side; K and V (one fused projection) from a source: the decoder's own
    positions (self-attention) or the encoder's output (cross-attention)."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        d = cfg.d_model
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.q = Linear(d, d, bias=cfg.bias)
        self.kv = Linear(d, 2 * d, bias=cfg.bias)
        self.out = Linear(d, d, bias=cfg.bias)

    def keys_values(self, source):
        """source (B, S, d) -> k, v, each (B, h, S, dh)."""
        B, S, _ = source.shape
        k, v = self.kv(source).view(B, S, 2, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        return k, v

    def forward(self, x, k, v, *, causal=False, allowed=None, head_mask=None, need_weights=False):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)   # (B, h, T, dh)
        y, att = attend(q, k, v, causal=causal, allowed=allowed, need_weights=need_weights)
        if head_mask is not None:  # each head's output, before the output projection
            y = y * head_mask.to(y.dtype)[None, :, None, None]
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.d_head)        # (B, T, h*dh)
        return self.out(y), att


class CrossAndFeedForward(nn.Module):
    """What both decoder layers end with: cross-attention over the encoder, then the FFN, each
    post-norm (residual, then LayerNorm)."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.cross = MultiHeadAttention(cfg)
        self.norm_cross = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = MLP(cfg.block_config())
        self.norm_ffn = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.pre_norm = cfg.pre_norm

    def cross_and_ffn(self, x, memory_kv, allowed, head_mask, need_weights):
        if self.pre_norm:  # Whisper: x + sublayer(norm(x))
            a, att = self.cross(self.norm_cross(x), *memory_kv, allowed=allowed, head_mask=head_mask,
                                need_weights=need_weights)
            x = x + a
            return x + self.mlp(self.norm_ffn(x)), att
        a, att = self.cross(x, *memory_kv, allowed=allowed, head_mask=head_mask, need_weights=need_weights)
        x = self.norm_cross(x + a)
        return self.norm_ffn(x + self.mlp(x)), att


class SSRUDecoderLayer(CrossAndFeedForward):
    """Bergamot: SSRU (no self-attention), cross-attention, FFN."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__(cfg)
        self.ssru = SSRU(cfg.d_model)
        self.norm_ssru = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)

    def forward(self, x, carry, memory_kv, *, allowed=None, head_mask=None, self_head_mask=None,
                need_weights=False, need_self=False):
        r, carry = self.ssru(x, carry)
        x = self.norm_ssru(x + r)
        x, att = self.cross_and_ffn(x, memory_kv, allowed, head_mask, need_weights)
        return x, carry, att, None

    def step_row(self, x, c, kT, v, into=None, head_mask=None):
        """`forward` for one row without module dispatch (greedy decoding's loop): x (1, d), c (1, d)
        or None, kT (h, dh, S) and v (h, S, dh) this layer's encoder K^T / V; the cross-attention
        weights (h, 1, S) are written into `into` when given. -> (x (1, d), c)."""
        lin, norm = torch.nn.functional.linear, torch.nn.functional.layer_norm
        wx, f = lin(x, *self.ssru.fused()).chunk(2, dim=-1)                   # (1, d) each
        f = torch.sigmoid(f)
        z = (1 - f) * wx
        c = z if c is None else torch.addcmul(z, f, c)
        d, eps, cross = x.shape[-1], self.norm_ssru.eps, self.cross
        x = norm(x + torch.relu(c), (d,), self.norm_ssru.weight, self.norm_ssru.bias, eps)
        q = lin(x, cross.q.weight, cross.q.bias).view(cross.n_heads, 1, cross.d_head)   # (h, 1, dh)
        att = torch.matmul(q, kT).mul_(1.0 / math.sqrt(cross.d_head))       # (h, 1, S)
        att = torch.softmax(att, dim=-1) if into is None else torch.softmax(att, dim=-1, out=into)
        y = torch.matmul(att, v)                                             # (h, 1, dh)
        if head_mask is not None:
            y = y * head_mask.to(y.dtype)[:, None, None]
        x = norm(x + lin(y.view(1, d), cross.out.weight, cross.out.bias), (d,),
                 self.norm_cross.weight, self.norm_cross.bias, eps)
        h = lin(torch.relu(lin(x, self.mlp.fc_in.weight, self.mlp.fc_in.bias)), self.mlp.fc_out.weight,
                self.mlp.fc_out.bias)
        return norm(x + h, (d,), self.norm_ffn.weight, self.norm_ffn.bias, eps), c


class AttentionDecoderLayer(CrossAndFeedForward):
    """HF Marian and BART: causal self-attention (its K/V cached), cross-attention, FFN."""

    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__(cfg)
        self.self_attn = MultiHeadAttention(cfg)
        self.norm_self = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)

    def forward(self, x, carry, memory_kv, *, allowed=None, head_mask=None, self_head_mask=None,
                need_weights=False, need_self=False):
        h = self.norm_self(x) if self.pre_norm else x
        k, v = self.self_attn.keys_values(h)
        if carry is not None:                       # earlier positions' K/V: (B, h, t, dh) each
            k, v = torch.cat([carry[0], k], dim=2), torch.cat([carry[1], v], dim=2)
        a, self_att = self.self_attn(h, k, v, causal=True, head_mask=self_head_mask, need_weights=need_self)
        x = x + a if self.pre_norm else self.norm_self(x + a)
        x, att = self.cross_and_ffn(x, memory_kv, allowed, head_mask, need_weights)
        return x, (k, v), att, self_att


@dataclass
class DecoderState:
    """One decoding's state, made per call by `Seq2Seq.start` (never stored on the model)."""
    memory_kv: list[tuple[torch.Tensor, torch.Tensor]]   # per layer: encoder K, V (B, h, S, dh)
    allowed: torch.Tensor | None                         # (B, 1, 1, S) source padding, or None
    carry: list = field(default_factory=list)           # per layer: SSRU c (B, d) or self K/V
    position: int = 0                                    # target positions fed so far

    def select(self, index: torch.Tensor) -> "DecoderState":
        """Keep (and repeat) batch rows `index`: beam search's reordering. Encoder K/V rows of one
        sentence are identical, so they are expanded views, never copies."""
        def pick(x):
            if x is None:
                return None
            if isinstance(x, tuple):
                return tuple(pick(t) for t in x)
            return x.index_select(0, index)

        memory = [(k[:1].expand(len(index), *k.shape[1:]), v[:1].expand(len(index), *v.shape[1:]))
                  for k, v in self.memory_kv]
        allowed = None if self.allowed is None else self.allowed.index_select(0, index)
        return DecoderState(memory, allowed, [pick(c) for c in self.carry], self.position)


@dataclass
class StepOutput:
    logits: torch.Tensor                  # (B, T, vocab)
    cross: dict[int, torch.Tensor]        # layer -> (B, h, T, S), when asked
    self_att: dict[int, torch.Tensor]     # layer -> (B, h, T, t), HF decoders, when asked


class Seq2Seq(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.tok = nn.Embedding(cfg.vocab_size, d)   # shared by source, target and output
        if cfg.positional == "learned":
            self.enc_pos = nn.Embedding(cfg.max_positions + cfg.position_offset, d)
            self.dec_pos = nn.Embedding(cfg.max_positions + cfg.position_offset, d)
        else:
            with torch.device("cpu"):  # built on the CPU explicitly: `from_state` constructs on "meta"
                table = sinusoid_halves(cfg.max_positions, d, marian=cfg.positional == "marian")
            self.register_buffer("sinusoid", table, persistent=False)
        if cfg.embedding_norm:
            self.enc_emb_norm = nn.LayerNorm(d, eps=cfg.norm_eps)
            self.dec_emb_norm = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.encoder = nn.ModuleList(Block(cfg.block_config()) for _ in range(cfg.n_enc_layers))
        layer = SSRUDecoderLayer if cfg.decoder == "ssru" else AttentionDecoderLayer
        self.decoder = nn.ModuleList(layer(cfg) for _ in range(cfg.n_dec_layers))
        if cfg.pre_norm:  # a pre-norm stack ends with one more LayerNorm on each side
            self.enc_final_norm = nn.LayerNorm(d, eps=cfg.norm_eps)
            self.dec_final_norm = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.lm_head = Linear(d, cfg.vocab_size)     # weight tied to `tok`; the bias is the model's own
        self.lm_head.weight = self.tok.weight

    @classmethod
    def from_state(cls, cfg: Seq2SeqConfig, state: dict) -> "Seq2Seq":
        """Adopt existing tensors (no copy, no random init). ValueError when they do not fit."""
        return adopt_state(lambda: cls(cfg), state, tied=True)

    def pack(self) -> int:
        """Prepack the encoder's and the output's linear weights (see `Linear`). The decoder's stay
        plain: a decoding step multiplies one row, where the plain product was ~20 % faster per
        translation than the prepacked one (measured on bench/translate_speed.py's sentences)."""
        linears = [m for part in (self.encoder, self.lm_head) for m in part.modules() if isinstance(m, Linear)]
        return sum(m.pack() for m in linears)

    # ---------------------------------------------------------------- embeddings
    def embed(self, ids, start: int, side: str):
        """ids (B, T) at positions start..start+T-1 -> (B, T, d)."""
        cfg, T = self.cfg, ids.shape[1]
        x = self.tok(ids) * cfg.embed_scale
        if side == "dec" and cfg.zero_start and start == 0:
            x[:, 0] = 0.0  # Bergamot starts from a zero vector, not a token's embedding
        if cfg.positional == "learned":
            table = self.enc_pos if side == "enc" else self.dec_pos
            x = x + table.weight[start + cfg.position_offset:start + cfg.position_offset + T]
        else:
            pos = self.sinusoid[start:start + T] if start + T <= self.sinusoid.shape[0] else \
                sinusoid_halves(T, cfg.d_model, start, cfg.positional == "marian")
            x = x + pos.to(x.dtype)
        if cfg.embedding_norm:
            x = (self.enc_emb_norm if side == "enc" else self.dec_emb_norm)(x)
        return x

    # ---------------------------------------------------------------- the block runner
    def encode(self, ids, *, allowed=None, head_mask=None, need_weights=False, weights_out=None):
        """ids (B, S) -> (memory (B, S, d), {layer: (B, h, S, S)} when capturing).
        `weights_out`: {layer: tensor} the weights are written into (no stacking copy later)."""
        x = self.embed(ids, 0, "enc")
        attentions = {}
        for i, block in enumerate(self.encoder):
            want = weights_out[i] if weights_out and i in weights_out else need_weights
            x, att = block(x, allowed=allowed, head_mask=None if head_mask is None else head_mask[i],
                           need_weights=want)
            if att is not None:
                attentions[i] = att
        return (self.enc_final_norm(x) if self.cfg.pre_norm else x), attentions

    def start(self, memory, allowed=None) -> DecoderState:
        """A fresh decoding over `memory` (B, S, d): each layer's encoder K/V, computed once."""
        kv = [layer.cross.keys_values(memory) for layer in self.decoder]
        return DecoderState(kv, allowed, [None] * len(self.decoder))

    def row_layout(self, state: DecoderState):
        """Each layer's encoder (K^T (h, dh, S), V (h, S, dh)), laid out once for `step_row`; or None
        where that fast path does not apply (not a post-norm ReLU SSRU decoder over one sentence)."""
        c = self.cfg
        if c.decoder != "ssru" or c.pre_norm or c.activation != "relu" or state.allowed is not None \
                or state.memory_kv[0][0].shape[0] != 1:
            return None
        if any(  # step_row reads every decoder weight directly: plain linear layers only (no quantized copy)
               hasattr(m, "in_features") and not isinstance(m, nn.Linear) for m in self.decoder.modules()):
            return None
        return [(k[0].transpose(-2, -1).contiguous(), v[0].contiguous()) for k, v in state.memory_kv]

    def step_row(self, x, carry: list, layout, *, head_mask=None, into=None):
        """`step` for one embedded row x (1, d) of an SSRU decoder (`row_layout`), `carry` updated in
        place; `into` [L, h, 1, S] receives the cross-attention weights. -> the last layer's (1, d)."""
        for i, layer in enumerate(self.decoder):
            x, carry[i] = layer.step_row(x, carry[i], *layout[i], None if into is None else into[i],
                                         None if head_mask is None else head_mask[i])
        return x

    def step(self, ids, state: DecoderState, *, head_mask=None, self_head_mask=None,
             need_weights=False, need_self=False, logits=True) -> StepOutput:
        """Feed target positions state.position.. (ids (B, T); position 0 is the start token) and
        advance `state`. `head_mask`: cross-attention [L_dec, H]; `self_head_mask`: self-attention."""
        x = self.embed(ids, state.position, "dec")
        cross, self_att = {}, {}
        for i, layer in enumerate(self.decoder):
            want = need_weights[i] if isinstance(need_weights, dict) else need_weights
            x, state.carry[i], att, s_att = layer(
                x, state.carry[i], state.memory_kv[i], allowed=state.allowed,
                head_mask=None if head_mask is None else head_mask[i],
                self_head_mask=None if self_head_mask is None else self_head_mask[i],
                need_weights=want, need_self=need_self)
            if att is not None:
                cross[i] = att
            if s_att is not None:
                self_att[i] = s_att
        state.position += ids.shape[1]
        if self.cfg.pre_norm:
            x = self.dec_final_norm(x)
        return StepOutput(self.lm_head(x) if logits else x, cross, self_att)
