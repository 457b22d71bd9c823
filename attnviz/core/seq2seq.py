"""Encoder-decoder transformers: the Bergamot students (SSRU decoder), HF Marian / BART / mBART /
M2M100 (NLLB) and T5 / mT5.

The config, the positions, then `Seq2Seq`: its encoder blocks are the core `Block`, its decoder
blocks `attnviz.core.decoder_blocks.CrossBlock`, and both run through the one forward loop
(`attnviz.core.blocks.iter_layers`): `encode` once, `start` a per-call `DecoderState` (the cache:
every layer's encoder K/V computed once), then `step` feeds only the new target positions and
carries the state (SSRU cell, or self-attention K/V); `step_row` is the loop's fused one-row path.
Head masks, mean ablation's fill and capture are arguments, never state: one loaded model serves
every caller.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from attnviz.core.base_model import adopt_state
from attnviz.core.blocks import Block, Linear, iter_layers
from attnviz.core.config import Config
from attnviz.core.decoder_blocks import CrossBlock
from attnviz.core.layers import make_norm
from attnviz.core.positional import RelativeBias

DECODERS = ("ssru", "attention")
POSITIONALS = ("marian", "hf_marian", "learned", "none")
# the fields a seq2seq config and its blocks' `Config` both state (sizes the shapes are built from)
SHARED = (("n_heads", "n_heads"), ("d_model", "d_model"), ("d_ff", "d_ff"), ("vocab_size", "vocab_size"),
          ("activation", "activation"), ("norm_eps", "norm_eps"), ("pre_norm", "pre_norm"), ("bias", "qkv_bias"))


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
                                 # frequencies 1e4^(-2i/d) (transformers' Marian); learned: a table (BART);
                                 # none: no absolute positions (T5: its blocks' relative bias instead)
    position_offset: int = 0     # the first position's row: 2 in BART's table, M2M100's sinusoid (fairseq legacies)
    embed_scale: float = 1.0     # sqrt(d_model) for Marian
    embedding_norm: bool = False  # BART: LayerNorm after embeddings + positions
    zero_start: bool = False     # Bergamot: the first decoder input is a zero vector, not a token
    decoder_start_id: int = 0    # the start token otherwise (Marian: pad; BART: </s>)
    eos_id: int = 0
    pad_id: int = 0
    max_positions: int = 1024
    bias: bool = True            # attention projections carry biases (all three families do)
    pre_norm: bool = False       # Whisper, mBART, M2M100, T5: a norm before each sublayer and after the last layer
    forced_bos_id: int = -1      # a token forced as the first target token (M2M100 / NLLB, mBART-50: the
                                 # target language's); -1: none
    output_scale: float = 1.0    # the decoder's output is multiplied by this before the output layer (T5: d^-1/2)
    tie_output: bool = True      # the output layer's weight is the shared embedding's
    blocks: Config | None = None  # the one core `Config` both sides' blocks read (see `block_config`);
                                  # None: LayerNorm blocks with biases, from the fields above

    def __post_init__(self):
        if not isinstance(self.family, str) or not self.family:
            raise ValueError(f"family must be a non-empty name; got {self.family!r:.40}")
        if self.decoder not in DECODERS or self.positional not in POSITIONALS:
            raise ValueError(f"decoder must be one of {DECODERS}, positional one of {POSITIONALS}")
        if isinstance(self.blocks, dict):  # read back from JSON (the conversion cache)
            object.__setattr__(self, "blocks", Config(**self.blocks))
        if self.blocks is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")
        for ours, theirs in SHARED if self.blocks is not None else ():
            if getattr(self, ours) != getattr(self.blocks, theirs):
                raise ValueError(f"{ours} is {getattr(self, ours)!r} but the blocks' config says "
                                 f"{getattr(self.blocks, theirs)!r}: build it with Seq2SeqConfig.of")
        if self.blocks is not None and self.blocks.n_layers != self.n_enc_layers:
            raise ValueError("the blocks' config counts the encoder's layers (n_layers = n_enc_layers)")

    @classmethod
    def of(cls, blocks: Config, n_dec_layers: int, **fields) -> "Seq2SeqConfig":
        """The seq2seq config whose both sides' blocks read `blocks` (a family's structural fields:
        norm, MLP, biases, scale, relative positions; its n_layers: the encoder's), the sizes taken
        from it."""
        return cls(family=blocks.family, n_enc_layers=blocks.n_layers, n_dec_layers=n_dec_layers,
                   blocks=blocks, **{ours: getattr(blocks, theirs) for ours, theirs in SHARED}, **fields)

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads if self.blocks is None else self.blocks.d_head

    @property
    def task(self) -> str:
        return "translation"

    def block_config(self, side: str = "encoder") -> Config:
        """The core config the blocks of one side read (`Block` for the encoder, `CrossBlock` for
        the decoder, both with `MLP`): `blocks` with `side`'s layer count. Its task is "encoder" on
        both sides: the blocks have no LM head and no patch embedding of their own (the decoder's
        causality and output layer belong to `CrossBlock` and `Seq2Seq`, not to the config).
        Without `blocks` (the Bergamot students, Whisper, the toys): LayerNorm blocks with biases,
        post-norm (residual, then LayerNorm) unless `pre_norm`, signed with this model's family."""
        if side not in ("encoder", "decoder"):
            raise ValueError(f"side must be 'encoder' or 'decoder', got {side!r}")
        n_layers = self.n_enc_layers if side == "encoder" else self.n_dec_layers
        if self.blocks is not None:
            return self.blocks.replace(n_layers=n_layers)
        return Config(family=self.family, task="encoder", n_layers=n_layers, n_heads=self.n_heads,
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


@dataclass
class DecoderState:
    """One decoding's state, made per call by `Seq2Seq.start` (never stored on the model): the
    cache `iter_layers` hands each decoder block, one dict per layer holding "memory" (the encoder's
    K, V (B, h, S, dh), computed once) and what the block carries on (an SSRU's cell "c", or the
    self-attention's "k", "v")."""
    layers: list[dict]
    allowed: torch.Tensor | None                         # (B, 1, 1, S) source padding, or None
    position: int = 0                                    # target positions fed so far

    def fresh(self) -> "DecoderState":
        """A new decoding over the same encoder output: its K/V kept, nothing carried."""
        return DecoderState([{"memory": layer["memory"]} for layer in self.layers], self.allowed)

    def select(self, index: torch.Tensor) -> "DecoderState":
        """Keep (and repeat) batch rows `index`: beam search's reordering. Encoder K/V rows of one
        sentence are identical, so they are expanded views, never copies."""
        def pick(name, x):
            if name == "memory":
                return tuple(t[:1].expand(len(index), *t.shape[1:]) for t in x)
            return x.index_select(0, index)

        allowed = None if self.allowed is None else self.allowed.index_select(0, index)
        layers = [{name: pick(name, x) for name, x in layer.items() if name in ("memory", "c", "k", "v")}
                  for layer in self.layers]
        return DecoderState(layers, allowed, self.position)


@dataclass
class StepOutput:
    logits: torch.Tensor                  # (B, T, vocab)
    cross: dict[int, torch.Tensor]        # layer -> (B, h, T, S), when asked
    self_att: dict[int, torch.Tensor]     # layer -> (B, h, T, t), HF decoders, when asked


class Seq2Seq(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig):
        super().__init__()
        self.cfg = cfg
        d, blocks = cfg.d_model, cfg.block_config()
        self.tok = nn.Embedding(cfg.vocab_size, d)   # shared by source, target and output
        if cfg.positional == "learned":
            self.enc_pos = nn.Embedding(cfg.max_positions + cfg.position_offset, d)
            self.dec_pos = nn.Embedding(cfg.max_positions + cfg.position_offset, d)
        elif cfg.positional != "none":
            with torch.device("cpu"):  # built on the CPU explicitly: `from_state` constructs on "meta"
                table = sinusoid_halves(cfg.max_positions, d, cfg.position_offset, cfg.positional == "marian")
            self.register_buffer("sinusoid", table, persistent=False)
        if blocks.positional == "relative":  # one bias per side, computed once a pass for every layer
            self.enc_rel = RelativeBias(blocks.rel_buckets, cfg.n_heads, blocks.rel_max_distance, True)
            self.dec_rel = RelativeBias(blocks.rel_buckets, cfg.n_heads, blocks.rel_max_distance, False)
        if cfg.embedding_norm:
            self.enc_emb_norm = nn.LayerNorm(d, eps=cfg.norm_eps)
            self.dec_emb_norm = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.encoder = nn.ModuleList(Block(cfg.block_config()) for _ in range(cfg.n_enc_layers))
        self.decoder = nn.ModuleList(CrossBlock(cfg.block_config("decoder"), cfg.decoder) for _ in range(cfg.n_dec_layers))
        if cfg.pre_norm:  # a pre-norm stack ends with one more norm on each side
            self.enc_final_norm = make_norm(blocks)
            self.dec_final_norm = make_norm(blocks)
        self.lm_head = Linear(d, cfg.vocab_size)     # weight tied to `tok` unless not `tie_output`; the bias is its own
        if cfg.tie_output:
            self.lm_head.weight = self.tok.weight

    @classmethod
    def from_state(cls, cfg: Seq2SeqConfig, state: dict) -> "Seq2Seq":
        """Adopt existing tensors (no copy, no random init). ValueError when they do not fit."""
        return adopt_state(lambda: cls(cfg), state, tied=cfg.tie_output)

    def position_bias(self, side: str, T: int, S: int):
        """The relative position bias (1, H, T, S) of `side`'s queries S-T..S-1 over keys 0..S-1,
        shared by that side's every self-attention layer; None without relative positions."""
        if not hasattr(self, "enc_rel"):
            return None
        return (self.enc_rel if side == "enc" else self.dec_rel)(T, S)

    def pack(self) -> int:
        """Prepack the encoder's and the output's linear weights (see `Linear`), also as their
        float16 grids where they have one (a sentence's few rows; the whole vocabulary's few rows a
        decoding). The decoder's stay plain: a decoding step multiplies one row, where the plain
        product was ~20 % faster per translation than the prepacked one (measured on
        bench/translate_speed.py's sentences)."""
        linears = [m for part in (self.encoder, self.lm_head) for m in part.modules() if isinstance(m, Linear)]
        return sum(m.pack(half=True) for m in linears)

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
        elif cfg.positional != "none":
            pos = self.sinusoid[start:start + T] if start + T <= self.sinusoid.shape[0] else \
                sinusoid_halves(T, cfg.d_model, start + cfg.position_offset, cfg.positional == "marian")
            x = x + pos.to(x.dtype)
        if cfg.embedding_norm:
            x = (self.enc_emb_norm if side == "enc" else self.dec_emb_norm)(x)
        return x

    def embed_row(self, token: int, t: int):
        """`embed` of one decoder token at position t -> (1, d): the same operations on one row
        (greedy decoding's one-row path), without the generic call's index tensors."""
        cfg = self.cfg
        x = self.tok.weight[token:token + 1] * cfg.embed_scale
        if cfg.zero_start and t == 0:
            x.zero_()  # Bergamot starts from a zero vector, not a token's embedding
        if cfg.positional == "learned":
            x = x.add_(self.dec_pos.weight[t + cfg.position_offset:t + cfg.position_offset + 1])
        elif cfg.positional != "none":
            pos = self.sinusoid[t:t + 1] if t < self.sinusoid.shape[0] else \
                sinusoid_halves(1, cfg.d_model, t + cfg.position_offset, cfg.positional == "marian")
            x = x.add_(pos.to(x.dtype))
        return self.dec_emb_norm(x) if cfg.embedding_norm else x

    # ---------------------------------------------------------------- running the blocks
    def encode(self, ids, *, allowed=None, head_mask=None, need_weights=False, weights_out=None,
               variants=None, head_fill=None, check=None, heads_out=None, patch=None, resume=None,
               states_out=None):
        """ids (B, S) (Whisper: log-mel frames) -> (memory (B, S, d), {layer: (B, h, S, S)} when
        capturing), through `iter_layers`. `weights_out`: {layer: tensor} the weights are written
        into (no stacking copy later); `variants`, `head_fill`, `check`, `patch` as `iter_layers` takes them;
        `heads_out`: a dict that receives every layer's per-head outputs (B, h, S, dh). Activation
        patching: `resume` (layer, x) runs from block `layer`'s input x instead of the embedded ids;
        `states_out`: a list receiving every block's input."""
        start, x = (0, self.embed(ids, 0, "enc")) if resume is None else resume
        attentions, S = {}, x.shape[1]
        for step in iter_layers(self.encoder, x, start, head_mask=head_mask, weights_out=weights_out,
                                position_bias=self.position_bias("enc", S, S),
                                capture=range(len(self.encoder)) if need_weights else (), variants=variants,
                                head_fill=head_fill, check=check, allowed=allowed, patch=patch,
                                head_outputs=range(len(self.encoder)) if heads_out is not None else ()):
            if states_out is not None:
                states_out.append(step.x)
            if step.weights is not None:
                attentions[step.layer] = step.weights
            if heads_out is not None:
                heads_out[step.layer] = step.heads
            x = step.out
        return (self.enc_final_norm(x) if self.cfg.pre_norm else x), attentions

    def start(self, memory, allowed=None) -> DecoderState:
        """A fresh decoding over `memory` (B, S, d): each layer's encoder K/V, computed once and laid
        out contiguous, head by head (the projection interleaves the heads within each row): every
        step then reads them in one pass, about twice as fast, with the same numbers."""
        return DecoderState([{"memory": tuple(t.contiguous() for t in block.cross.keys_values(memory))}
                             for block in self.decoder], allowed)

    def row_state(self, memory, start: DecoderState | None = None) -> DecoderState | None:
        """A decoding over `memory` (1, S, d) laid out for the one-row path (`step_row`): each layer's
        encoder K/V as the path reads them, projected straight into that layout, or `start`'s
        (a `start(memory)`) laid out again. None where the path does not apply (not a post-norm
        ReLU SSRU decoder of plain linear layers over one unpadded sentence)."""
        if memory.shape[0] != 1 or (start is not None and start.allowed is not None) or \
                not all(block.row_ready() for block in self.decoder):
            return None
        if start is None:
            return DecoderState([block.row_past(memory) for block in self.decoder], None)
        state = start.fresh()
        for block, layer in zip(self.decoder, state.layers):
            block.lay_out(layer)
        return state

    def step_row(self, x, state: DecoderState, *, head_mask=None, head_fill=None, into=None):
        """`step` for one embedded row x (1, d) of an SSRU decoder laid out by `row_state`: the
        runner's `row` path; `into` [L, h, 1, S] receives the cross-attention weights. -> the last
        layer's (1, d)."""
        for step in iter_layers(self.decoder, x, head_mask=head_mask, head_fill=head_fill, weights_out=into,
                                cache=state.layers, row=True):
            x = step.out
        state.position += 1
        return x

    def all_heads(self, layer: int, weights, state: DecoderState, T: int) -> torch.Tensor:
        """A cross-attention layer's weights (B, h, T, S) over every ORIGINAL head (B, H, T, S): a
        pruned layer's dropped heads (`Seq2SeqModel.prune`) read as zero rows."""
        attn = self.decoder[layer].cross
        if weights is not None and attn.n_heads == self.cfg.n_heads:
            return weights
        k = state.layers[layer]["memory"][0]                                  # (B, h_kv, S, dh)
        full = torch.zeros(k.shape[0], self.cfg.n_heads, T, k.shape[2])
        if weights is not None:
            full[:, attn.heads] = weights
        return full

    def step(self, ids, state: DecoderState, *, head_mask=None, self_head_mask=None, need_weights=False,
             need_self=False, logits=True, head_fill=None, heads_out=None, patch=None) -> StepOutput:
        """Feed target positions state.position.. (ids (B, T); position 0 is the start token) and
        advance `state`, through `iter_layers`. `head_mask` [L_dec, H] and `head_fill` [L_dec, H,
        d_head]: the cross-attention's; `self_head_mask`: the self-attention's; `need_weights`: a
        bool, or {layer: bool}; `heads_out`: a dict receiving the cross heads' outputs; `patch`:
        {layer: patch(name, t)}, the cross-attention's (activation patching, see `Attention`)."""
        x = self.embed(ids, state.position, "dec")
        L, T = len(self.decoder), ids.shape[1]
        capture = [i for i in range(L) if (need_weights.get(i) if isinstance(need_weights, dict) else need_weights)]
        cross, self_att = {}, {}
        for step in iter_layers(self.decoder, x, head_mask=head_mask, self_head_mask=self_head_mask,
                                capture=capture, self_capture=range(L) if need_self and self.cfg.decoder != "ssru"
                                else (), head_fill=head_fill, cache=state.layers, allowed=state.allowed,
                                head_outputs=range(L) if heads_out is not None else (), patch=patch,
                                position_bias=self.position_bias("dec", T, state.position + T)):
            if step.layer in capture:
                cross[step.layer] = self.all_heads(step.layer, step.weights, state, T)
            if step.self_weights is not None:
                self_att[step.layer] = step.self_weights
            if heads_out is not None:
                heads_out[step.layer] = step.heads
            x = step.out
        state.position += ids.shape[1]
        if self.cfg.pre_norm:
            x = self.dec_final_norm(x)
        if self.cfg.output_scale != 1.0:
            x = x * self.cfg.output_scale
        return StepOutput(self.lm_head(x) if logits else x, cross, self_att)
