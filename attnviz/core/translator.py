"""The public objects of encoder-decoder models: `Seq2SeqModel` and its `Translation`.

`m.translate(text)` runs the encoder once, then decodes incrementally (each step feeds only the
new position; the encoder K/V of every layer and the SSRU cell or self-attention K/V live in a
per-call `DecoderState`), greedy or beam search with Marian's length normalisation. `m.trace(source,
target=...)` runs the same network teacher-forced on a given target. Both return a `Translation`:

    cross_attentions    [L_dec, H, n_tgt, n_src]  row t: where the decoder looked choosing target t
    encoder_attentions  [L_enc, H, n_src, n_src]
    self_attentions     [L_dec, H, n_tgt, n_tgt]  HF Marian / BART decoders (None for an SSRU decoder)
    logprobs            [n_tgt]                   log-probability of each target token when chosen

Every row sums to 1. Target tokens include the end of sentence; the decoder's input at step t is
the start symbol (t = 0) or target token t - 1.
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import replace

import torch
import torch.nn.functional as F

from attnviz.base.jobs import Deadline, heavy_job
from attnviz.base.limits import LIMITS
from attnviz.core import decoding, surgery
from attnviz.core.base_model import BaseModel, ModelInfo
from attnviz.core.decoding import Decoded
from attnviz.core.seq2seq import Seq2Seq, Seq2SeqConfig
from attnviz.core.translation_parts import Pieces, Shortlist, Translation

__all__ = ["Seq2SeqModel", "MAX_BEAM"]

MAX_BEAM = 5
LENGTH_FACTOR = 2.5         # decoding stops at 2.5 x source + 5 tokens (Marian's max-length-factor)
LENGTH_SLACK = 5


class Seq2SeqModel(BaseModel):
    """An encoder-decoder of ours plus its tokenizer. Shared, never mutated by a call."""

    def __init__(self, net: Seq2Seq, info: ModelInfo, tokenizer=None, shortlist: Shortlist | None = None):
        super().__init__(net, info)
        self.pieces = None if tokenizer is None else Pieces(tokenizer, net.cfg.eos_id)
        self.shortlist = shortlist
        # the token forced first in every target (a multilingual model's target language; -1: none)
        self.forced_first = net.cfg.forced_bos_id

    @classmethod
    def build(cls, cfg: Seq2SeqConfig, state: dict, key: str, source: str, tokenizer=None,
              shortlist: Shortlist | None = None, **info) -> "Seq2SeqModel":
        """Adopt converted tensors (a family's weights half, or the cache) as a shared model."""
        net = Seq2Seq.from_state(cfg, state)
        return cls(net, cls.describe(key, cfg, source, net, **info), tokenizer, shortlist)

    @classmethod
    def shape(cls, cfg: Seq2SeqConfig) -> dict:
        return dict(n_layers=cfg.n_enc_layers + cfg.n_dec_layers, n_heads=cfg.n_heads,
                    n_kv_heads=cfg.n_heads, max_positions=cfg.max_positions)

    @property
    def has_tokenizer(self) -> bool:
        return self.pieces is not None

    @property
    def kind(self) -> str:
        return "translator"

    @property
    def languages(self) -> list[str]:
        """The language tokens of a multilingual model's tokenizer (its added special tokens: NLLB's
        eng_Latn, M2M100's __en__, mBART-50's en_XX), in its order; [] for a model of one pair."""
        tokenizer = None if self.pieces is None or self.pieces.native else self.pieces.tokenizer
        extra = getattr(tokenizer, "extra_special_tokens", None) or getattr(tokenizer, "additional_special_tokens", None)
        # T5's sentinels (<extra_id_0>...) are special tokens too, but no language
        found = [t for t in extra or [] if isinstance(t, str) and not (t.startswith("<") and t.endswith(">"))]
        return [t for t in found if tokenizer.convert_tokens_to_ids(t) is not None]

    @property
    def target_language(self) -> str | None:
        """The language token forced first in every target, or None."""
        return None if self.forced_first < 0 or self.pieces is None else self.pieces.label(self.forced_first)

    def prune(self, keep) -> "Seq2SeqModel":
        """A NEW model without the cross-attention heads `keep` (BoolTensor [L_dec, H], ORIGINAL
        numbering) switches off: the same outputs as `head_mask=keep.float()`, from smaller layers
        (their K/V projected once a sentence, read every step); this one is untouched. Heads
        already pruned stay gone; a pruned head's cross-attention reads as zero rows."""
        c = self.cfg
        keep = surgery.check_keep(keep, c.n_dec_layers, c.n_heads)
        blocks, decoder = c.block_config("decoder"), []
        for i, held in enumerate(self.net.decoder):   # a copy of each block sharing every module but its cross-attention
            block = copy.copy(held)
            block._modules = dict(held._modules)
            block.cross = surgery.sliced_attention(held.cross, blocks, [h for h in held.cross.heads.tolist() if keep[i, h]])
            decoder.append(block)
        net = copy.copy(self.net)
        net._modules = dict(self.net._modules)
        net.decoder = type(self.net.decoder)(decoder)
        gone = sum(c.n_heads - len(b.cross.heads) for b in net.decoder)
        twin = Seq2SeqModel(net, replace(self.info, key=f"{self.info.key} (pruned {gone}/{keep.numel()})"),
                            None, self.shortlist)
        twin.pieces, twin.forced_first = self.pieces, self.forced_first
        return twin

    def position_bias(self, n: int, side: str = "encoder") -> torch.Tensor | None:
        """[H, n, n] what each head of `side`'s ("encoder" or "decoder") self-attention adds to its
        scores for n positions from their distances alone (T5's relative positions: one table, every
        layer of the side), as the blocks add it; None for a model without relative positions."""
        if side not in ("encoder", "decoder"):
            raise ValueError(f"side must be 'encoder' or 'decoder', got {side!r}")
        with torch.inference_mode():
            bias = self.net.position_bias("enc" if side == "encoder" else "dec", n, n)
        return None if bias is None else bias[0].float()

    def into(self, language: str) -> "Seq2SeqModel":
        """This model translating into `language` (one of `languages`): its token forced as the first
        target token, as transformers' forced-BOS decoding does. A new model object over the same
        network and tokenizer (the shared one is never changed)."""
        if language not in self.languages:
            shown = ", ".join(self.languages[:8]) or "none: this model translates one pair"
            raise ValueError(f"{str(language)[:40]!r} is not one of this model's languages ({shown})")
        twin = copy.copy(self)
        twin.forced_first = int(self.pieces.tokenizer.convert_tokens_to_ids(language))
        twin.info = replace(self.info, key=f"{self.info.key} → {language}")
        return twin

    @property
    def mask_layers(self) -> int:
        return self.cfg.n_dec_layers   # `head_mask` switches the decoder's cross-attention heads

    @property
    def cfg(self) -> Seq2SeqConfig:
        return self.net.cfg

    def __repr__(self):
        c = self.cfg
        return (f"Seq2SeqModel({self.info.key!r}, {c.family}, {c.n_enc_layers}+{c.n_dec_layers} layers "
                f"x {c.n_heads} heads, {c.decoder} decoder)")

    # ---------------------------------------------------------------- input
    def source(self, x) -> tuple[torch.Tensor, list[str], int]:
        """(ids [n_src] ending with the end of sentence, labels, tokens cut)."""
        limit = LIMITS.max_source_tokens
        if isinstance(x, str):
            ids, labels = self.pieces.encode(self.check_text(x))
        else:
            ids = self.check_ids(x, "source").tolist()
            if ids[-1] != self.cfg.eos_id:
                ids.append(self.cfg.eos_id)
            labels = self.pieces.labels(ids) if self.pieces else [str(i) for i in ids]
        cut = max(0, len(ids) - limit)
        if cut:  # keep the first limit - 1 pieces and the end of sentence
            ids, labels = ids[:limit - 1] + ids[-1:], labels[:limit - 1] + labels[-1:]
        return torch.tensor(ids, dtype=torch.long), labels, cut

    def _masks(self, head_mask, encoder_head_mask, self_head_mask) -> dict:
        c = self.cfg
        if self_head_mask is not None and c.decoder == "ssru":
            raise ValueError("this decoder has no self-attention (an SSRU instead): there is no self_head_mask")
        return dict(cross=self.check_head_mask(head_mask, c.n_dec_layers, "head_mask (cross-attention)"),
                    encoder=self.check_head_mask(encoder_head_mask, c.n_enc_layers, "encoder_head_mask"),
                    self=self.check_head_mask(self_head_mask, c.n_dec_layers, "self_head_mask"))

    def target_bound(self, n_src: int) -> int:
        return min(LIMITS.max_target_tokens, int(LENGTH_FACTOR * n_src) + LENGTH_SLACK)

    # ---------------------------------------------------------------- running
    def _encode(self, src: torch.Tensor, masks: dict, attentions: bool, check=None):
        """src: ids [S] (a speech model: log-mel frames [n_mels, 2 S]) -> (memory (1, S, d), the
        encoder's weights [L_enc, H, S, S] or None); `check()` runs before every encoder block."""
        c = self.cfg
        S = len(src) if src.dim() == 1 else src.shape[-1] // 2
        buf = torch.empty(c.n_enc_layers, c.n_heads, S, S) if attentions else None
        memory, _ = self.net.encode(src[None], head_mask=masks["encoder"], head_fill=masks.get("encoder_fill"),
                                    variants=masks.get("variant"), check=check,
                                    weights_out=None if buf is None else buf[:, None])
        return memory, buf

    def check_fill(self, fill, n_layers: int, what: str) -> torch.Tensor | None:
        """A mean ablation's fill [n_layers, H, d_head] (added to the heads' outputs after the mask),
        or ValueError."""
        if fill is None:
            return None
        c = self.cfg
        f = torch.as_tensor(fill, dtype=torch.float32)
        if tuple(f.shape) != (n_layers, c.n_heads, c.d_head):
            raise ValueError(f"{what} must have shape [{n_layers}, {c.n_heads}, {c.d_head}] (layers x heads x "
                             f"head width); got {list(f.shape)}")
        if not torch.isfinite(f).all():
            raise ValueError(f"{what} must hold finite numbers")
        return f

    def _fills(self, head_fill, encoder_head_fill) -> dict:
        c = self.cfg
        return dict(cross_fill=self.check_fill(head_fill, c.n_dec_layers, "head_fill (cross-attention)"),
                    encoder_fill=self.check_fill(encoder_head_fill, c.n_enc_layers, "encoder_head_fill"))

    def head_means(self, source: torch.Tensor, target) -> dict[str, torch.Tensor]:
        """Every head's mean output over one input's positions, every head on: {"encoder": [L_enc,
        H, d_head], "cross": [L_dec, H, d_head]}: what mean ablation fills a switched-off head with
        (`head_fill = (1 - mask) x mean`). `source`: the source ids (a `Translation.source_ids`; a
        speech model: its log-mel frames); `target`: the target ids, the end included
        (teacher-forced after the start)."""
        target = torch.as_tensor(list(target), dtype=torch.long)
        if target.numel() == 0:
            raise ValueError("head means need a non-empty target")
        enc, cross = {}, {}
        with torch.inference_mode():
            memory, _ = self.net.encode(torch.as_tensor(source)[None], heads_out=enc)
            feed = torch.cat([self._start_ids(), target[None, :-1]], dim=1)
            self.net.step(feed, self.net.start(memory), heads_out=cross, logits=False)
        return {name: torch.stack([heads[i][0].float().mean(1) for i in range(len(heads))])   # (h, n, dh) -> (h, dh)
                for name, heads in (("encoder", enc), ("cross", cross))}

    def _start_ids(self, n: int = 1) -> torch.Tensor:
        return torch.full((n, 1), self.cfg.decoder_start_id, dtype=torch.long)

    def adjust_logits(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        """Decoding's hook on step `step`'s logits (..., vocab): the first target token is forced
        where the model names one (the target language of M2M100 / NLLB, mBART-50), as transformers'
        forced-BOS processor does it (every other token -inf, the forced one 0); speech models
        suppress tokens."""
        forced = self.forced_first
        if step != 0 or forced < 0:
            return logits
        out = torch.full_like(logits, float("-inf"))
        out[..., forced] = 0.0
        return out

    def translate(self, text, beam: int = 1, max_tokens: int | None = None, head_mask=None,
                  encoder_head_mask=None, self_head_mask=None, *, attentions: bool = True,
                  cache: bool = True, shortlist: bool = False, head_fill=None,
                  encoder_head_fill=None) -> Translation:
        """Translate `text` (or source token ids). `head_mask` [L_dec, H] masks cross-attention heads;
        `encoder_head_mask` [L_enc, H] the encoder's; `head_fill` [L_dec, H, d_head] and
        `encoder_head_fill` [L_enc, H, d_head] are added to those heads' outputs after the mask (mean
        ablation: (1 - mask) x `head_means`); `cache=False` recomputes every prefix (tests).
        `shortlist=True` scores only the lexical shortlist's pieces, as the native engine does
        (log-probabilities and top candidates are then over the shortlist)."""
        if isinstance(beam, bool) or not isinstance(beam, int) or not 1 <= beam <= MAX_BEAM:
            raise ValueError(f"beam must be a whole number from 1 to {MAX_BEAM}, got {beam!r}")
        if shortlist and self.shortlist is None:
            raise ValueError(f"model {self.info.key!r} has no lexical shortlist; translate with shortlist=False")
        masks = self._masks(head_mask, encoder_head_mask, self_head_mask)
        masks.update(self._fills(head_fill, encoder_head_fill))
        src, labels, cut = self.source(text)
        masks["shortlist"] = self._vocabulary(src) if self.shortlist is not None else None
        masks["vocab"] = masks["shortlist"] if shortlist else None
        n_max = self.target_limit(len(src), max_tokens)
        heavy = beam > 1 and len(src) > LIMITS.heavy_beam_tokens
        deadline = Deadline(LIMITS.max_translate_seconds, "the translation")
        with heavy_job("a long beam search") if heavy else contextlib.nullcontext(), torch.inference_mode():
            memory, enc_att = self._encode(src, masks, attentions)  # short: the deadline stops decoding
            if beam == 1:
                out = self._greedy(memory, masks, n_max, deadline, attentions, cache)
            else:  # the beam and the teacher-forced pass share the encoder K/V, computed once
                start = self.net.start(memory)
                ids, stopped = self._beam(memory, masks, beam, n_max, deadline, start)
                out = replace(self._teacher(memory, masks, ids, attentions, start), stopped=stopped)
        return self._result(src, labels, cut, out, enc_att, n_max, beam)

    def trace(self, source, head_mask=None, *, target=None, encoder_head_mask=None,
              self_head_mask=None, head_fill=None, encoder_head_fill=None) -> Translation:
        """The same tensors, teacher-forced on `target` (text or ids; the end of sentence is added
        when missing). Without a target, the greedy translation is traced. The common entry of
        every model: `trace(input, head_mask)`."""
        if target is None:
            target = self.translate(source, head_mask=head_mask, encoder_head_mask=encoder_head_mask,
                                    self_head_mask=self_head_mask, attentions=False, head_fill=head_fill,
                                    encoder_head_fill=encoder_head_fill).target_ids.tolist()
        masks = self._masks(head_mask, encoder_head_mask, self_head_mask)
        masks.update(self._fills(head_fill, encoder_head_fill))
        src, labels, cut = self.source(source)
        if isinstance(target, str):
            ids = self.pieces.encode(self.check_text(target), target=True)[0]
        else:
            ids = self.check_ids(target, "target").tolist()
            if ids[-1] != self.cfg.eos_id:
                ids.append(self.cfg.eos_id)
        if len(ids) > LIMITS.max_target_tokens:
            raise ValueError(f"the target has {len(ids)} tokens; the limit is {LIMITS.max_target_tokens}")
        with torch.inference_mode():
            memory, enc_att = self._encode(src, masks, True)
            out = self._teacher(memory, masks, ids, True)
        return self._result(src, labels, cut, out, enc_att, len(ids), 1)

    def _result(self, src, labels, cut, out: Decoded, enc_att, n_max, beam) -> Translation:
        ids = out.ids.tolist()
        text = self.pieces.decode(ids) if self.pieces else " ".join(map(str, ids))
        targets = self.pieces.labels(ids) if self.pieces else [str(i) for i in ids]
        return Translation(text=text, source_tokens=labels, target_tokens=targets,
                           source_ids=src, target_ids=out.ids, cross_attentions=out.cross,
                           encoder_attentions=enc_att, logprobs=out.logprobs, top_ids=out.top_ids,
                           top_logprobs=out.top_logprobs, self_attentions=out.self_att, stopped=out.stopped,
                           truncated=cut, max_tokens=n_max, beam=beam)

    def _vocabulary(self, src: torch.Tensor):
        """(candidate ids, their output weights [n, d], biases [n]) for a shortlisted decoding."""
        cand = self.shortlist.candidates(src)
        # once per sentence; index_select is several times faster than advanced indexing here
        return cand, self.net.tok.weight.detach().index_select(0, cand), \
            self.net.lm_head.bias.detach().index_select(0, cand)

    def _logits(self, out, vocab):
        """Full-vocabulary logits, or the shortlist's (the step ran with logits=False)."""
        return out.logits if vocab is None else F.linear(out.logits, vocab[1], vocab[2])

    # the decoding loops (attnviz.core.decoding), as methods: a speech model's hooks apply
    _greedy = decoding.greedy
    _greedy_rows = decoding.greedy_rows
    _scored = decoding.scored
    _beam = decoding.beam
    _teacher = decoding.teacher
