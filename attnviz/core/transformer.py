"""One config-driven transformer for five families: BERT, GPT-2, Llama, ViT, DINOv2.

The model around `attnviz.core.blocks`' blocks: embeddings, the blocks run by the one forward loop
(`iter_layers`, here as `iter_blocks`), the final norm and heads. Capture of attention
weights, head masks and attention variants are arguments of `forward`, never state: one loaded
model serves every caller at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnviz.core.attention import padding_mask
from attnviz.core.audio_frames import AudioFrames
from attnviz.core.base_model import adopt_state
from attnviz.core.blocks import ACTIVATIONS, Block, Linear, iter_layers, make_norm
from attnviz.core.config import Config
from attnviz.core.positional import (RelativeBias, interpolate_grid, relative_index, rope_cos_sin, sinusoidal,
                                       square_grid)

ROPE_CACHE_MAX = 8192  # positions precomputed; longer inputs compute their table on the fly

@dataclass
class Output:
    hidden: torch.Tensor                       # (B, n, d_model), last_hidden_state
    logits: torch.Tensor | None                # (B, n, vocab) for language models
    attentions: dict[int, torch.Tensor]        # layer -> (B, h_layer, n, n), captured layers only
    states: list[torch.Tensor] | None = None   # input of every block, then the final hidden


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
            self.patch = nn.Conv2d(cfg.n_channels, d, cfg.patch_size, stride=cfg.patch_size, bias=cfg.patch_bias)
            self.cls = nn.Parameter(torch.zeros(1, 1, d)) if cfg.cls_token else None
            self.distill = nn.Parameter(torch.zeros(1, 1, d)) if cfg.distill_token else None
            learned = cfg.positional == "learned"
            self.pos = nn.Parameter(torch.zeros(1, cfg.n_positioned + cfg.grid ** 2, d)) if learned else None
            self.registers = nn.Parameter(torch.zeros(1, cfg.n_registers, d)) if cfg.n_registers else None
        elif cfg.is_audio:  # samples -> frames through convolutions, positions added there (wav2vec 2.0)
            self.audio = AudioFrames(cfg)
        else:
            e = cfg.embed_width
            self.tok = nn.Embedding(cfg.vocab_size, e)
            # RoBERTa's table starts with padding's rows (`pad_position`): the positions come after them
            rows = cfg.max_positions + cfg.pad_position + 1
            self.pos = nn.Embedding(rows, e) if cfg.positional == "learned" else None
            self.types = nn.Embedding(cfg.type_vocab_size, e) if cfg.type_vocab_size else None
        self.emb_norm = make_norm(cfg, cfg.embed_width) if cfg.embedding_norm else None
        self.embed_proj = Linear(cfg.d_embed, d) if cfg.d_embed else None
        # one table of per-head score biases by relative-position bucket, read by every layer (MPNet)
        self.rel_bias = (RelativeBias(cfg.rel_buckets, cfg.n_heads, cfg.rel_max_distance, bidirectional=True)
                         if cfg.rel_buckets else None)
        # relative-position embeddings every layer projects into its position terms (DeBERTa)
        self.rel_emb = nn.Embedding(2 * cfg.rel_span, d) if cfg.disentangled else None
        self.rel_norm = make_norm(cfg) if cfg.disentangled and cfg.rel_norm else None
        self.blocks = nn.ModuleList(
            Block(cfg, None if heads is None else heads[i], None if kv_heads is None else kv_heads[i], i)
            for i in range(cfg.n_layers))
        self.norm = make_norm(cfg) if cfg.final_norm else None
        self.lm_head = None
        if cfg.mlm_head:
            self.mlm_transform = Linear(d, cfg.embed_width)
            self.mlm_norm = make_norm(cfg, cfg.embed_width)
        if cfg.task == "lm" or cfg.mlm_head or cfg.ctc_head:
            self.lm_head = Linear(cfg.embed_width if cfg.mlm_head else d, cfg.vocab_size,
                                  bias=cfg.mlm_head or cfg.lm_head_bias or cfg.ctc_head)
            if cfg.tie_embeddings:
                self.lm_head.weight = self.tok.weight
        if cfg.positional == "rotary":
            n = min(cfg.max_positions, ROPE_CACHE_MAX)
            with torch.device("cpu"):
                cos, sin = self._rope_table(n)
                local = self._rope_table(n, local=True) if cfg.local_rope_theta else None
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
            # the windowed layers' own base (Gemma 3), unscaled; None where every layer shares one
            self.register_buffer("rope_local_cos", None if local is None else local[0], persistent=False)
            self.register_buffer("rope_local_sin", None if local is None else local[1], persistent=False)

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
        if self.cfg.embed_scale != 1.0:  # Gemma: √d_model, rounded to the weights' dtype as transformers does
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        if self.pos is not None and self.cfg.pad_position >= 0:
            x = x + self.pos(self.positions(ids))
        elif self.pos is not None:
            x = x + self.pos.weight[offset:offset + T]
        elif self.cfg.positional == "sinusoidal":
            x = x + sinusoidal(offset + T, self.cfg.d_model)[offset:].to(x.dtype)
        if self.types is not None:
            types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids
            x = x + self.types(types)
        x = self.emb_norm(x) if self.emb_norm is not None else x
        return self.embed_proj(x) if self.embed_proj is not None else x

    def positions(self, ids):
        """(B, T) rows of the position table RoBERTa's ids read: a padding token reads the
        padding row; the others count on from the row after it, padding not counted."""
        pad = self.cfg.pad_position
        real = ids != pad
        return torch.cumsum(real, dim=1) * real + pad

    def embed_image(self, pixels):
        cfg = self.cfg
        B, _, H, W = pixels.shape
        x = self.patch(pixels).flatten(2).transpose(1, 2)  # (B, gh*gw, d)
        k = cfg.n_positioned                               # CLS and DeiT's distillation token
        if self.pos is not None:
            x = x + interpolate_grid(self.pos[:, k:], cfg.grid, H // cfg.patch_size, W // cfg.patch_size)
        prefix = [t.expand(B, -1, -1) for t in (self.cls, self.distill) if t is not None]
        if prefix:
            first = torch.cat(prefix, dim=1)
            x = torch.cat([first if self.pos is None else first + self.pos[:, :k], x], dim=1)
        if self.registers is not None:  # registers go after CLS and carry no position
            x = torch.cat([x[:, :k], self.registers.expand(B, -1, -1), x[:, k:]], dim=1)
        return self.emb_norm(x) if self.emb_norm is not None else x

    def embed_audio(self, samples):
        """samples (B, n), as the feature extractor gives them -> frames (B, T, d), the blocks' input."""
        x = self.audio(samples)
        return self.emb_norm(x) if self.emb_norm is not None else x

    def embed(self, input_ids=None, pixel_values=None, input_values=None, token_type_ids=None):
        """The first block's input from whichever input this model takes."""
        if self.cfg.is_vision:
            return self.embed_image(pixel_values)
        if self.cfg.is_audio:
            return self.embed_audio(input_values)
        return self.embed_text(input_ids, token_type_ids)

    def _rope_table(self, T: int, local: bool = False):
        cfg = self.cfg
        if local:
            return rope_cos_sin(T, cfg.rope_dim, cfg.local_rope_theta)
        return rope_cos_sin(T, cfg.rope_dim, cfg.rope_theta, scaling=cfg.rope_scaling)

    def rope(self, T: int, local: bool = False):
        """(cos, sin) of positions 0..T-1: the global layers' tables, or (`local`) the windowed ones'."""
        cos, sin = (self.rope_local_cos, self.rope_local_sin) if local else (self.rope_cos, self.rope_sin)
        if T <= cos.shape[0]:
            return cos[:T], sin[:T]
        return self._rope_table(T, local)

    def shared(self, n: int, offset: int = 0, attention_mask=None) -> dict:
        """What every block of a pass over positions offset..offset+n-1 reads besides its input:
        the rotary tables, the padding mask (`attention_mask` (B, n): 1 for real tokens), causality.
        `Block.explain(x, **shared)` reads a block's attention with the same arguments."""
        cfg = self.cfg
        out = {"allowed": padding_mask(attention_mask) if attention_mask is not None else None,
               "causal": cfg.causal, "rope": None}
        if self.rel_bias is not None:
            out["position_bias"] = self.relative_bias(n, offset)
        if self.rel_emb is not None:
            if offset:
                raise ValueError("disentangled position terms are computed over a whole text, not after a cache")
            emb = self.rel_emb.weight
            out["rel_pos"] = (emb if self.rel_norm is None else self.rel_norm(emb),
                              relative_index(n, cfg.rel_span, cfg.rel_log_max).to(emb.device))
        if cfg.rel_pos_bias:  # BEiT: the patch grid the relative offsets are read on
            out["rel_grid"] = square_grid(n - cfg.n_prefix)
        if cfg.positional == "rotary":  # absolute positions offset..offset+n-1
            cos, sin = self.rope(offset + n)
            out["rope"] = (cos[offset:], sin[offset:])
            if cfg.local_rope_theta:
                cos, sin = self.rope(offset + n, local=True)
                out["rope_local"] = (cos[offset:], sin[offset:])
        return out

    def relative_bias(self, n: int, offset: int = 0) -> torch.Tensor:
        """(1, H, n, offset + n) every head's score bias for queries at positions offset..offset+n-1
        and keys at 0..offset+n-1, read from the shared table by relative-position bucket."""
        return self.rel_bias(n, offset + n)   # T5's bidirectional buckets, as MPNet reads them

    # ---------------------------------------------------------------- the forward loop
    def iter_blocks(self, x, start: int = 0, stop: int | None = None, *, head_mask=None, capture=(),
                    weights_out=None, variants=None, attention_mask=None, check=None,
                    head_outputs=(), head_fill=None, cache=None, offset: int = 0, patch=None):
        """The forward loop (`iter_layers`) over this model's blocks: blocks start..stop-1 from x = the input of block `start` (B, n, d),
        yielding a `BlockStep` per block (callers that look at one layer at a time, such as long
        captures and head scores, never hold every layer's weights).
        `head_mask` [L, H] (1 keeps a head) or [B, L, H] (a mask per batch row); `capture`: layers
        whose weights to return;
        `weights_out`: {layer: (B, h, n, n) tensor} to write those layers' weights into;
        `variants`: a Variant for every layer, or {layer: Variant} for some; `attention_mask`
        (B, n): 1 for real tokens; `check()` runs before every block (a deadline or a cancel).
        `head_outputs`: layers whose per-head outputs to return (`BlockStep.heads`); `head_fill`
        [L, H, d_head]: added to the heads' outputs after the mask (mean ablation); `cache`: one
        dict per layer holding its keys and values (incremental decoding, see `Attention`), and
        `offset` the position of x's first token after what the cache holds; `patch`: {layer:
        patch(name, tensor)} edits of q / k / v / per-head outputs (activation patching)."""
        yield from iter_layers(self.blocks, x, start, stop, head_mask=head_mask, capture=capture,
                               weights_out=weights_out, variants=variants, check=check,
                               head_outputs=head_outputs, head_fill=head_fill, cache=cache, patch=patch,
                               **self.shared(x.shape[1], offset, attention_mask))

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

    def finish(self, x, logits: bool = True, softcap: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last block's output (B, n, d) -> (final hidden, logits or None): final norm and LM head
        (then the logits' soft cap, Gemma 2, unless `softcap=False`: the sum the cap bends)."""
        if self.norm is not None:
            x = self.norm(x)
        if not logits or self.lm_head is None:
            return x, None
        h = self.mlm_norm(ACTIVATIONS[self.cfg.activation](self.mlm_transform(x))) if self.cfg.mlm_head else x
        logits = self.lm_head(h)
        cap = self.cfg.final_softcap if softcap else 0.0
        return x, logits if not cap else torch.tanh(logits / cap) * cap

    def forward(self, input_ids=None, pixel_values=None, *, input_values=None, token_type_ids=None,
                attention_mask=None, head_mask=None, need_weights=False, layers=None, variants=None, states=False,
                weights_out=None, logits=True, check=None, head_fill=None) -> Output:
        """`input_values` (B, n): an audio model's samples, as its feature extractor writes them;
        `layers`: which layers' weights to capture (default all, when need_weights); the rest as
        in `iter_blocks`."""
        x = self.embed(input_ids, pixel_values, input_values, token_type_ids)
        capture = (range(self.cfg.n_layers) if layers is None else layers) if need_weights else ()
        run = self.run_blocks(x, head_mask=head_mask, head_fill=head_fill, capture=capture, weights_out=weights_out,
                              variants=variants, attention_mask=attention_mask, states=states, check=check)
        hidden, out_logits = self.finish(run.x, logits)
        return Output(hidden, out_logits, run.weights, run.states + [hidden] if states else None)
