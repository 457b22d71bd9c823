"""Text attending to an image (BLIP's image-text matching): `Matcher`, a vision `Model` with a text
encoder whose every layer reads its own words (self-attention, both ways) and then the image
(cross-attention: the words are the queries, the image's patches the keys and values), and a
yes / no head on its first token. `Reading` is what it computed for one image and one text.

The text encoder's layers are the encoder-decoder's `CrossBlock`s run by the one block loop
(`iter_layers`), so its cross-attention is the one attention module's, as a translator's is; its
head mask switches cross-attention heads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from attnviz.core.base_model import ModelInfo
from attnviz.core.blocks import Linear, iter_layers, make_norm
from attnviz.core.config import Config
from attnviz.core.decoder_blocks import CrossBlock
from attnviz.core.model import Model, Trace
from attnviz.core.tokens import labels as token_labels
from attnviz.core.transformer import Transformer


class TextOverImage(nn.Module):
    """Token and position embeddings, a norm, post-norm `CrossBlock`s over the image, the
    matching head (logits of [no match, match] on the first token)."""

    def __init__(self, cfg: Config, image_width: int):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.emb_norm = make_norm(cfg)
        self.blocks = nn.ModuleList(CrossBlock(cfg, "attention", causal=cfg.causal, source_width=image_width)
                                    for _ in range(cfg.n_layers))
        self.itm_head = Linear(cfg.d_model, 2)

    def forward(self, ids, image, *, head_mask=None, self_head_mask=None):
        """ids (B, n), image (B, S, d_image): the vision tower's output -> (hidden (B, n, d),
        cross weights [L] of (B, H, n, S), self weights [L] of (B, H, n, n), match logits (B, 2))."""
        x = self.emb_norm(self.tok(ids) + self.pos.weight[: ids.shape[1]])
        cache = [{"memory": b.cross.keys_values(image)} for b in self.blocks]     # K/V of the image, per layer
        every = range(len(self.blocks))
        cross, own = [], []
        for step in iter_layers(self.blocks, x, head_mask=head_mask, self_head_mask=self_head_mask, capture=every,
                                self_capture=every, cache=cache):
            cross.append(step.weights)
            own.append(step.self_weights)
            x = step.out
        return x, cross, own, self.itm_head(x[:, 0])


@dataclass
class Reading:
    """One text read against one image."""
    image: Trace                     # the vision tower's trace
    tokens: list[str]
    ids: torch.Tensor                # [n]
    cross_attentions: torch.Tensor   # [L, H, n, S] each word (query) over the image's tokens (keys and values)
    self_attentions: torch.Tensor    # [L, H, n, n]
    hidden: torch.Tensor             # [n, d] the text encoder's output
    match: float                     # P(the text matches the image): the matching head's softmax

    @property
    def patch_attentions(self) -> torch.Tensor:
        """[L, H, n, gh, gw] each word's cross-attention over the patches (CLS left out)."""
        gh, gw = self.image.grid
        prefix = self.image.n_prefix
        return self.cross_attentions[..., prefix:].reshape(*self.cross_attentions.shape[:-1], gh, gw)


class Matcher(Model):
    """A vision `Model` whose text encoder reads the image (`read`)."""

    def __init__(self, net: Transformer, info: ModelInfo, text: TextOverImage, tokenizer=None, **image):
        super().__init__(net, info, tokenizer, **image)
        self.text = text.eval()
        for p in self.text.parameters():
            p.requires_grad_(False)

    @property
    def text_cfg(self) -> Config:
        return self.text.cfg

    def parts(self) -> tuple:
        return (self.net, self.text)

    def prune(self, keep) -> "Matcher":
        """The vision tower pruned (a new model); the text encoder is shared, unchanged."""
        small = super().prune(keep)
        return Matcher(small.net, small.info, self.text, self.tokenizer, image_mean=self.image_mean,
                       image_std=self.image_std, image_size=self.image_size, kept=small.kept)

    def text_ids(self, text) -> torch.Tensor:
        """Token ids [n] of a text (the model's tokenizer, special tokens included) or ids as given."""
        cfg = self.text_cfg
        if not isinstance(text, str):
            ids = torch.as_tensor(text)
            if ids.dim() != 1 or not len(ids) or ids.is_floating_point() or len(ids) > cfg.max_positions \
                    or int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size:
                raise ValueError(f"text token ids must be a 1-D list of 1..{cfg.max_positions} ids in [0, {cfg.vocab_size})")
            return ids.long()
        self.check_text(text)
        return torch.tensor(self.tokenizer(text, truncation=True, max_length=cfg.max_positions)["input_ids"])

    def read(self, image, text, cross_mask=None, head_mask=None, image_size: int | None = None,
             trace: Trace | None = None) -> Reading:
        """The text read against the image. `cross_mask` [L_text, H]: 1 keeps a cross-attention
        head, 0 switches it off; `head_mask`: the vision tower's; `trace`: the image's trace when
        already made (with that mask)."""
        cfg = self.text_cfg
        if cross_mask is not None:
            cross_mask = torch.as_tensor(cross_mask, dtype=torch.float32)
            if list(cross_mask.shape) != [cfg.n_layers, cfg.n_heads] or torch.isnan(cross_mask).any() \
                    or cross_mask.min() < 0 or cross_mask.max() > 1:
                raise ValueError(f"cross_mask must be [{cfg.n_layers}, {cfg.n_heads}] (text layers x heads), "
                                 "values in [0, 1] (1 keeps a head, 0 switches it off)")
        ids = self.text_ids(text)
        tr = trace if trace is not None else self.trace(image, head_mask=head_mask, image_size=image_size)
        with torch.inference_mode():
            hidden, cross, own, logits = self.text(ids[None], tr.hidden[None], head_mask=cross_mask)
        tokens = token_labels(self.tokenizer, ids.tolist())[0] if self.tokenizer is not None else \
            [str(i) for i in ids.tolist()]
        return Reading(image=tr, tokens=tokens, ids=ids, cross_attentions=torch.stack([c[0] for c in cross]),
                       self_attentions=torch.stack([s[0] for s in own]), hidden=hidden[0],
                       match=float(torch.softmax(logits[0], -1)[1]))
