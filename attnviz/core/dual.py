"""Two towers, one image and several captions (CLIP, SigLIP): `DualModel`, a vision `Model` whose
text tower, projections and pooling come along (`Towers`), and `Match`, what it computed for one
image against its captions.

The vision tower is the model the Images page already shows (its trace, head mask and pruning are
`Model`'s); the text tower is a second `Transformer` with its own tokenizer. Each tower's pooled
token is read through the one attention module: CLIP's CLS token and the text's end-of-text token
are rows of their traces, SigLIP's image probe is a cross-attention (`Attention(fused=False)`:
the probe as the only query, the patches as keys and values).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnviz.core.base_model import ModelInfo
from attnviz.core.blocks import MLP, Attention, Linear, make_norm
from attnviz.core.config import Config
from attnviz.core.model import Model, Trace
from attnviz.core.transformer import Transformer

TEXT_POOLS = ("eos", "argmax", "last")   # the text's pooled token: the first end-of-text id, the highest id, the last
IMAGE_POOLS = ("cls", "probe")           # the image's: CLS through a norm, or an attention-pooling probe
SCORES = ("softmax", "sigmoid")          # captions compete for the image (CLIP), or each is a yes / no (SigLIP)


@dataclass(frozen=True)
class Joint:
    """How the two towers meet: their pooling, projections and scoring (a family's fields)."""
    text: Config
    text_pool: str = "eos"
    eos_id: int = 0
    image_pool: str = "cls"
    score: str = "softmax"
    proj_dim: int = 0                 # a linear projection of each pooled token to this width (0: none)
    text_proj_bias: bool = False      # SigLIP's text head is a biased linear of the same width
    pad_text: bool = False            # captions padded to the text tower's positions (SigLIP was trained so)

    def __post_init__(self):
        for name, value, known in (("text_pool", self.text_pool, TEXT_POOLS),
                                   ("image_pool", self.image_pool, IMAGE_POOLS), ("score", self.score, SCORES)):
            if value not in known:
                raise ValueError(f"{name} must be one of {', '.join(known)}; got {value!r:.40}")


class PoolingHead(nn.Module):
    """SigLIP's attention pooling: a learned probe attends to every patch (the one attention
    module, un-fused), then a residual MLP on its normed output."""

    def __init__(self, cfg: Config):
        super().__init__()
        cfg = cfg.replace(head_dims=None, kv_dims=None)
        self.probe = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
        self.attn = Attention(cfg, fused=False)
        self.norm = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, hidden, need_weights=False):
        """hidden (B, n, d) -> (pooled (B, d), the probe's weights (B, h, 1, n) or None)."""
        probe = self.probe.expand(hidden.shape[0], -1, -1)
        a, att = self.attn(probe, kv=self.attn.keys_values(hidden), need_weights=need_weights)
        return (a + self.mlp(self.norm(a)))[:, 0], att


class Towers(nn.Module):
    """What a two-tower model has besides its vision tower."""

    def __init__(self, vision: Config, joint: Joint):
        super().__init__()
        self.joint = joint
        self.text = Transformer(joint.text)
        d_v, d_t = vision.d_model, joint.text.d_model
        self.post_norm = make_norm(vision) if joint.image_pool == "cls" else None
        self.pool = PoolingHead(vision) if joint.image_pool == "probe" else None
        self.visual_proj = Linear(d_v, joint.proj_dim, bias=False) if joint.proj_dim else None
        self.text_proj = (Linear(d_t, joint.proj_dim or d_t, bias=joint.text_proj_bias)
                          if joint.proj_dim or joint.text_proj_bias else None)
        self.logit_scale = nn.Parameter(torch.zeros(()))
        self.logit_bias = nn.Parameter(torch.zeros(())) if joint.score == "sigmoid" else None


@dataclass
class Match:
    """One image against several captions."""
    image: Trace                     # the vision tower's trace
    texts: list[Trace]               # the text tower's trace of each caption
    captions: list[str]
    logits: torch.Tensor             # [c] the model's score of each caption
    probs: torch.Tensor              # [c] softmax over the captions (CLIP) or each caption's sigmoid (SigLIP)
    image_reads: torch.Tensor        # [L', H, n] what the image's pooled token reads: CLS per layer, or the probe (L' = 1)
    text_reads: list[torch.Tensor]   # per caption [L, H, n_tokens]: what its pooled token reads, per layer
    pooled: list[int]                # per caption: the index of its pooled token
    image_embedding: torch.Tensor    # [p] L2-normalised
    text_embeddings: torch.Tensor    # [c, p] L2-normalised
    score: str                       # "softmax" | "sigmoid"
    probe: bool                      # whether image_reads is an attention-pooling probe's (not CLS rows)


class DualModel(Model):
    """A vision `Model` with a text tower: `match(image, captions)` scores captions and says which
    patches and which words each tower's pooled token reads."""

    def __init__(self, net: Transformer, info: ModelInfo, towers: Towers, tokenizer=None, **image):
        super().__init__(net, info, **image)
        self.towers = towers.eval()
        for p in self.towers.parameters():
            p.requires_grad_(False)
        self.text_model = Model(towers.text, replace(info, key=f"{info.key} (text tower)", task="encoder"),
                                tokenizer)

    @property
    def joint(self) -> Joint:
        return self.towers.joint

    def parts(self) -> tuple:
        return (self.net, self.towers)

    def prune(self, keep) -> "DualModel":
        """The vision tower pruned (a new model); the text tower and pooling are shared, unchanged."""
        small = super().prune(keep)
        return DualModel(small.net, small.info, self.towers, self.text_model.tokenizer, image_mean=self.image_mean,
                         image_std=self.image_std, image_size=self.image_size, kept=small.kept)

    # ---------------------------------------------------------------- towers
    def caption_ids(self, caption) -> torch.Tensor:
        """A caption's token ids as the reference tokenizes it (padded where the family pads)."""
        text = self.text_model
        ids = text.encode_text(caption)[0] if isinstance(caption, str) else text.check_ids(caption, "caption")
        pad = getattr(text.tokenizer, "pad_token_id", None)
        if self.joint.pad_text and pad is not None and len(ids) < text.max_tokens:
            ids = torch.cat([ids, torch.full((text.max_tokens - len(ids),), pad, dtype=torch.long)])
        return ids

    def pooled_index(self, ids: torch.Tensor) -> int:
        j = self.joint
        if j.text_pool == "last":
            return len(ids) - 1
        if j.text_pool == "argmax":
            return int(ids.argmax())
        found = (ids == j.eos_id).nonzero().flatten()
        if not len(found):
            raise ValueError("the caption has no end-of-text token, which this model pools; "
                             "tokenize it with the model's own tokenizer")
        return int(found[0])

    def text_embedding(self, tr: Trace, index: int) -> torch.Tensor:
        """[p] the caption's embedding from its trace (the text tower's final hidden states)."""
        pooled = tr.hidden[index]
        with torch.inference_mode():
            return pooled if self.towers.text_proj is None else self.towers.text_proj(pooled)

    def image_embedding(self, tr: Trace) -> tuple[torch.Tensor, torch.Tensor]:
        """([p] the image's embedding, [L', H, n] what its pooled token reads) from its trace."""
        t = self.towers
        with torch.inference_mode():
            if t.pool is not None:
                pooled, att = t.pool(tr.hidden[None], need_weights=True)
                reads = att[:, :, 0]                                    # (1, H, n)
                pooled = pooled[0]
            else:
                pooled = t.post_norm(tr.hidden[0])
                reads = tr.attentions[:, :, 0] if tr.attentions is not None else None
            return (pooled if t.visual_proj is None else t.visual_proj(pooled)), reads

    def match(self, image, captions, head_mask=None, image_size: int | None = None, trace: Trace | None = None) -> Match:
        """Score the captions against the image. `trace`: the image's trace when already made
        (with the same head mask)."""
        if isinstance(captions, str) or not captions:
            raise ValueError("give a list of one or more captions")
        tr = trace if trace is not None else self.trace(image, head_mask=head_mask, image_size=image_size)
        image_emb, reads = self.image_embedding(tr)
        texts, pooled, embs = [], [], []
        for caption in captions:
            ids = self.caption_ids(caption)
            t = self.text_model.trace(ids)
            texts.append(t)
            pooled.append(self.pooled_index(ids))
            embs.append(self.text_embedding(t, pooled[-1]))
        img, txt = F.normalize(image_emb, dim=-1), F.normalize(torch.stack(embs), dim=-1)
        t = self.towers
        logits = txt @ img * t.logit_scale.exp()
        if t.logit_bias is not None:
            logits = logits + t.logit_bias
        probs = torch.sigmoid(logits) if self.joint.score == "sigmoid" else torch.softmax(logits, 0)
        return Match(image=tr, texts=texts, captions=[str(c) for c in captions], logits=logits, probs=probs,
                     image_reads=reads, text_reads=[x.attentions[:, :, i] for x, i in zip(texts, pooled)],
                     pooled=pooled, image_embedding=img, text_embeddings=txt, score=self.joint.score,
                     probe=t.pool is not None)
