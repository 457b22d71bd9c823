"""The public objects of encoder-decoder models: `Seq2SeqModel` and its `Translation`.

`m.translate(text)` runs the encoder once, then decodes incrementally (each step feeds only the
new position; the encoder K/V of every layer and the SSRU cell or self-attention K/V live in a
per-call `DecoderState`), greedy or beam search with Marian's length normalisation. `m.trace(source,
target)` runs the same network teacher-forced on a given target. Both return a `Translation`:

    cross_attentions    [L_dec, H, n_tgt, n_src]  row t: where the decoder looked choosing target t
    encoder_attentions  [L_enc, H, n_src, n_src]
    self_attentions     [L_dec, H, n_tgt, n_tgt]  HF Marian / BART decoders (None for an SSRU decoder)
    logprobs            [n_tgt]                   log-probability of each target token when chosen

Every row sums to 1. Target tokens include the end of sentence; the decoder's input at step t is
the start symbol (t = 0) or target token t - 1.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from attnviz.base.jobs import Deadline, heavy_job
from attnviz.base.limits import LIMITS
from attnviz.core.model import ModelInfo, count_params, weights_fingerprint
from attnviz.core.seq2seq import DecoderState, Seq2Seq, Seq2SeqConfig
from attnviz.core.translation import Pieces, Shortlist, Translation, self_matrix

__all__ = ["Seq2SeqModel", "Translation", "Pieces", "Shortlist", "MAX_BEAM", "TOP_K"]

MAX_BEAM = 5
TOP_K = 10                  # next-token candidates kept per step (the page's step-through)
LENGTH_FACTOR = 2.5         # decoding stops at 2.5 x source + 5 tokens (Marian's max-length-factor)
LENGTH_SLACK = 5
LENGTH_NORMALISE = 1.0      # beam: score / length^1.0, as Marian's --normalize 1.0 (eos counted)


class Seq2SeqModel:
    """An encoder-decoder of ours plus its tokenizer. Shared, never mutated by a call."""

    def __init__(self, net: Seq2Seq, info: ModelInfo, tokenizer=None, shortlist: Shortlist | None = None):
        self.net = net.eval()
        self.info = info
        self.pieces = None if tokenizer is None else Pieces(tokenizer, net.cfg.eos_id)
        self.shortlist = shortlist
        for p in self.net.parameters():
            p.requires_grad_(False)
        if LIMITS.packed_linear:
            self.net.pack()

    @classmethod
    def build(cls, cfg: Seq2SeqConfig, state: dict, key: str, source: str, tokenizer=None,
              shortlist: Shortlist | None = None, **info) -> "Seq2SeqModel":
        """Adopt converted tensors (a family's weights half, or the cache) as a shared model."""
        net = Seq2Seq.from_state(cfg, state)
        info = ModelInfo(key=key, family=cfg.family, task=cfg.task, n_layers=cfg.n_enc_layers + cfg.n_dec_layers,
                         n_heads=cfg.n_heads, source=source, n_kv_heads=cfg.n_heads,
                         max_positions=cfg.max_positions, params=count_params(net), **info)
        return cls(net, info, tokenizer, shortlist)

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
            if not x.strip():
                raise ValueError("the text is empty; type or paste a sentence")
            if len(x) > LIMITS.max_text_chars:
                raise ValueError(f"the text has {len(x):,} characters; the limit is {LIMITS.max_text_chars:,}. "
                                 "Paste a shorter passage.")
            if self.pieces is None:
                raise ValueError(f"model {self.info.key!r} has no tokenizer; pass token ids instead of text")
            ids, labels = self.pieces.encode(x)
        else:
            ids = self._ids(x, "source")
            if ids[-1] != self.cfg.eos_id:
                ids.append(self.cfg.eos_id)
            labels = [self.pieces.label(i) for i in ids] if self.pieces else [str(i) for i in ids]
        cut = max(0, len(ids) - limit)
        if cut:  # keep the first limit - 1 pieces and the end of sentence
            ids, labels = ids[:limit - 1] + ids[-1:], labels[:limit - 1] + labels[-1:]
        return torch.tensor(ids, dtype=torch.long), labels, cut

    def _ids(self, x, what: str) -> list[int]:
        try:
            ids = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"the {what} must be text or a 1-D list of token ids") from None
        if ids.dim() != 1 or ids.numel() == 0 or ids.is_floating_point() or ids.dtype == torch.bool:
            raise ValueError(f"the {what} must be text or a non-empty 1-D list of token ids")
        if int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size:
            raise ValueError(f"{what} token ids must lie in [0, {self.cfg.vocab_size})")
        return ids.tolist()

    def check_mask(self, mask, n_layers: int, what: str) -> torch.Tensor | None:
        if mask is None:
            return None
        m = torch.as_tensor(mask, dtype=torch.float32)
        if tuple(m.shape) != (n_layers, self.cfg.n_heads):
            raise ValueError(f"{what} must have shape [{n_layers}, {self.cfg.n_heads}] (layers x heads); "
                             f"got {list(m.shape)}")
        if torch.isnan(m).any() or m.min() < 0 or m.max() > 1:
            raise ValueError(f"{what} values must lie in [0, 1] (1 keeps a head, 0 removes it)")
        return m

    def _masks(self, head_mask, encoder_head_mask, self_head_mask) -> dict:
        c = self.cfg
        if self_head_mask is not None and c.decoder == "ssru":
            raise ValueError("this decoder has no self-attention (an SSRU instead): there is no self_head_mask")
        return dict(cross=self.check_mask(head_mask, c.n_dec_layers, "head_mask (cross-attention)"),
                    encoder=self.check_mask(encoder_head_mask, c.n_enc_layers, "encoder_head_mask"),
                    self=self.check_mask(self_head_mask, c.n_dec_layers, "self_head_mask"))

    def target_limit(self, n_src: int, max_tokens=None) -> int:
        bound = min(LIMITS.max_target_tokens, int(LENGTH_FACTOR * n_src) + LENGTH_SLACK)
        if max_tokens is None:
            return bound
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a whole number of at least 1, got {max_tokens!r}")
        return min(max_tokens, bound)

    # ---------------------------------------------------------------- running
    def _encode(self, src: torch.Tensor, masks: dict, attentions: bool):
        c, S = self.cfg, len(src)
        buf = torch.empty(c.n_enc_layers, c.n_heads, S, S) if attentions else None
        memory, _ = self.net.encode(src[None], head_mask=masks["encoder"], head_fill=masks.get("encoder_fill"),
                                    weights_out=None if buf is None else buf[:, None])
        return memory, buf

    def _start_ids(self, n: int = 1) -> torch.Tensor:
        return torch.full((n, 1), self.cfg.decoder_start_id, dtype=torch.long)

    def adjust_logits(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        """Greedy decoding's hook on step `step`'s logits (vocab,): speech models suppress tokens."""
        return logits

    def translate(self, text, beam: int = 1, max_tokens: int | None = None, head_mask=None,
                  encoder_head_mask=None, self_head_mask=None, *, attentions: bool = True,
                  cache: bool = True, shortlist: bool = False) -> Translation:
        """Translate `text` (or source token ids). `head_mask` [L_dec, H] masks cross-attention heads;
        `encoder_head_mask` [L_enc, H] the encoder's; `cache=False` recomputes every prefix (tests).
        `shortlist=True` scores only the lexical shortlist's pieces, as the native engine does
        (log-probabilities and top candidates are then over the shortlist)."""
        if isinstance(beam, bool) or not isinstance(beam, int) or not 1 <= beam <= MAX_BEAM:
            raise ValueError(f"beam must be a whole number from 1 to {MAX_BEAM}, got {beam!r}")
        if shortlist and self.shortlist is None:
            raise ValueError(f"model {self.info.key!r} has no lexical shortlist; translate with shortlist=False")
        masks = self._masks(head_mask, encoder_head_mask, self_head_mask)
        src, labels, cut = self.source(text)
        masks["shortlist"] = self._vocabulary(src) if self.shortlist is not None else None
        masks["vocab"] = masks["shortlist"] if shortlist else None
        n_max = self.target_limit(len(src), max_tokens)
        heavy = beam > 1 and len(src) > LIMITS.heavy_beam_tokens
        deadline = Deadline(LIMITS.max_translate_seconds, "the translation")
        with heavy_job("a long beam search") if heavy else contextlib.nullcontext(), torch.inference_mode():
            memory, enc_att = self._encode(src, masks, attentions)
            if beam == 1:
                out = self._greedy(memory, masks, n_max, deadline, attentions, cache)
            else:
                ids, stopped = self._beam(memory, masks, beam, n_max, deadline)
                out = self._teacher(memory, masks, ids, attentions) + (stopped,)
        target, logprobs, tops, cross, self_att, stopped = out
        return self._result(src, labels, cut, target, logprobs, tops, cross, enc_att, self_att,
                            stopped, n_max, beam)

    def trace(self, source, target=None, head_mask=None, encoder_head_mask=None,
              self_head_mask=None) -> Translation:
        """The same tensors, teacher-forced on `target` (text or ids; the end of sentence is added
        when missing). Without a target, the greedy translation is traced."""
        if target is None:
            target = self.translate(source, head_mask=head_mask, encoder_head_mask=encoder_head_mask,
                                    self_head_mask=self_head_mask, attentions=False).target_ids.tolist()
        masks = self._masks(head_mask, encoder_head_mask, self_head_mask)
        src, labels, cut = self.source(source)
        if isinstance(target, str):
            if not target.strip() or self.pieces is None:
                raise ValueError("the target is empty (or this model has no tokenizer: give token ids)")
            ids = self.pieces.encode(target)[0]
        else:
            ids = self._ids(target, "target")
            if ids[-1] != self.cfg.eos_id:
                ids.append(self.cfg.eos_id)
        if len(ids) > LIMITS.max_target_tokens:
            raise ValueError(f"the target has {len(ids)} tokens; the limit is {LIMITS.max_target_tokens}")
        with torch.inference_mode():
            memory, enc_att = self._encode(src, masks, True)
            target, logprobs, tops, cross, self_att = self._teacher(memory, masks, ids, True)
        return self._result(src, labels, cut, target, logprobs, tops, cross, enc_att, self_att,
                            "given", len(ids), 1)

    def _result(self, src, labels, cut, target, logprobs, tops, cross, enc_att, self_att,
                stopped, n_max, beam) -> Translation:
        ids = target.tolist()
        label = self.pieces.label if self.pieces else str
        text = self.pieces.decode(ids) if self.pieces else " ".join(map(str, ids))
        return Translation(text=text, source_tokens=labels, target_tokens=[label(i) for i in ids],
                           source_ids=src, target_ids=target, cross_attentions=cross,
                           encoder_attentions=enc_att, logprobs=logprobs, top_ids=tops[1],
                           top_logprobs=tops[0], self_attentions=self_att, stopped=stopped,
                           truncated=cut, max_tokens=n_max, beam=beam)

    def _vocabulary(self, src: torch.Tensor):
        """(candidate ids, their output weights [n, d], biases [n]) for a shortlisted decoding."""
        cand = self.shortlist.candidates(src)
        return cand, self.net.tok.weight[cand], self.net.lm_head.bias[cand]

    def _logits(self, out, vocab):
        """Full-vocabulary logits, or the shortlist's (the step ran with logits=False)."""
        return out.logits if vocab is None else F.linear(out.logits, vocab[1], vocab[2])

    def _greedy(self, memory, masks, n_max, deadline, attentions, cache):
        """Greedy decoding. Per step only the product and the argmax; log-probabilities and top
        candidates come from every step's logits at once after the loop."""
        net, eos, vocab = self.net, self.cfg.eos_id, masks["vocab"]
        state = net.start(memory)
        if cache and self._start_ids().shape[1] == 1 and net.row_layout(state) is not None:
            return self._greedy_rows(masks, n_max, deadline, attentions, state, memory.shape[1])
        L, feed = len(net.decoder), self._start_ids()
        ids, cols, logit_rows, rows, self_rows = [], [], [], [], []
        stopped = "max_tokens"
        for _ in range(n_max):
            if not cache:  # recompute every position from a fresh state: the reference for the cache
                state = net.start(memory)
                feed = torch.cat([self._start_ids(), torch.tensor([ids], dtype=torch.long)], 1) if ids \
                    else self._start_ids()
            out = net.step(feed, state, head_mask=masks["cross"], self_head_mask=masks["self"],
                           head_fill=masks.get("cross_fill"), need_weights=attentions, need_self=attentions,
                           logits=vocab is None)
            logits = self._logits(out, vocab)[0, -1].float()
            if vocab is None:
                logits = self.adjust_logits(logits, len(ids))
            logit_rows.append(logits)
            best = logits.argmax()
            cols.append(best)
            nxt = int(best if vocab is None else vocab[0][best])
            ids.append(nxt)
            if attentions:
                rows.append(torch.stack([out.cross[j][0, :, -1] for j in range(L)]))
                if out.self_att:
                    self_rows.append([out.self_att[j][0, :, -1] for j in range(L)])
            if nxt == eos:
                stopped = "eos"
                break
            if deadline.expired():
                stopped = "deadline"
                break
            feed = torch.tensor([[nxt]])
        cross = torch.stack(rows, dim=2) if rows else None            # [L, H, n_tgt, S]
        return self._scored(ids, torch.stack(logit_rows), torch.stack(cols), vocab) + (
            cross, self_matrix(self_rows), stopped)

    def _greedy_rows(self, masks, n_max, deadline, attentions, state, S):
        """Greedy decoding of an SSRU decoder, one row a step (`Seq2Seq.step_row`), its cross-
        attention written straight into [L, H, n_max, S]. For the whole vocabulary with a shortlist
        at hand, each step scores only the shortlist (~250 pieces, as the native engine) and one
        product over the whole vocabulary after the loop checks every step (the hidden rows do not
        depend on what was scored): where the whole vocabulary's choice differs, decoding resumes
        from that step with it (only the steps after it are checked again). The tokens are exactly
        whole-vocabulary greedy, and the 32,000 x 256 output matrix is read once per pass rather
        than once per token."""
        net, eos, vocab = self.net, self.cfg.eos_id, masks["vocab"]
        check = vocab is None and masks.get("shortlist") is not None
        scored = masks["shortlist"] if check else vocab
        buf = torch.empty(len(net.decoder), self.cfg.n_heads, n_max, S) if attentions else None
        ids, cols, hidden, logit_rows, carries = [], [], [], [], []
        t, done, stopped = 0, 0, "max_tokens"   # done: steps checked against the whole vocabulary
        while True:
            while t < n_max:
                feed = self._start_ids() if t == 0 else torch.tensor([[ids[t - 1]]])
                x = net.step_row(net.embed(feed, t, "dec")[0], state, head_mask=masks["cross"],
                                 head_fill=masks.get("cross_fill"),
                                 into=None if buf is None else buf[:, :, t:t + 1])     # x (1, d)
                hidden.append(x)
                carries.append([layer["c"] for layer in state.layers])  # the state after step t: where a check resumes
                logits = (net.lm_head(x) if scored is None else F.linear(x, scored[1], scored[2]))[0].float()
                logit_rows.append(logits)
                best = logits.argmax()
                cols.append(best)
                ids.append(int(best if scored is None else scored[0][best]))
                t += 1
                if ids[-1] == eos or deadline.expired():
                    stopped = "eos" if ids[-1] == eos else "deadline"
                    break
            if not check:
                logits, cols = torch.stack(logit_rows), torch.stack(cols)
                break
            # the steps not yet checked, in one product over the whole vocabulary: (n - done, vocab)
            new = net.lm_head(torch.cat(hidden[done:])).float()
            full = new if done == 0 else torch.cat([full[:done], new])
            picks = full.argmax(-1).tolist()
            k = next((i for i in range(done, len(ids)) if picks[i] != ids[i]), None)
            if k is None:
                logits, cols = full, torch.tensor(picks)
                break
            # step k's whole-vocabulary choice is outside the shortlist: take it, go on from there
            ids, hidden, carries = ids[:k] + [picks[k]], hidden[:k + 1], carries[:k + 1]
            for layer, c in zip(state.layers, carries[k]):
                layer["c"] = c
            t, done = k + 1, k + 1
            stopped = "eos" if ids[-1] == eos else "max_tokens"
            if ids[-1] == eos or t >= n_max:
                logits, cols = full[:t], torch.tensor(picks[:t])
                break
        cross = None if buf is None else buf[:, :, :len(ids)].contiguous()   # [L, H, n_tgt, S]
        return self._scored(ids, logits, cols, vocab) + (cross, None, stopped)

    def _scored(self, ids: list[int], logits, cols, vocab):
        """Each step's logits (n, vocab or shortlist) and chosen columns -> (ids, logprobs, tops)."""
        logp = torch.log_softmax(logits, dim=-1)
        top_v, top_i = logp.topk(min(TOP_K, logp.shape[-1]), dim=-1)
        return (torch.tensor(ids), logp.gather(1, cols[:, None])[:, 0],
                (top_v, top_i if vocab is None else vocab[0][top_i]))

    def _beam(self, memory, masks, beam: int, n_max: int, deadline) -> tuple[list[int], str]:
        """Marian's beam search: the beam shrinks by one for every hypothesis that ends; the best
        finished hypothesis by score / length^LENGTH_NORMALISE wins."""
        net, eos, vocab = self.net, self.cfg.eos_id, masks["vocab"]
        V = self.cfg.vocab_size if vocab is None else len(vocab[0])
        state: DecoderState = net.start(memory)
        hyps, scores, feed = [[]], torch.zeros(1), self._start_ids()
        finished, live, stopped = [], beam, "eos"
        for t in range(n_max):
            logits = self._logits(net.step(feed, state, head_mask=masks["cross"], self_head_mask=masks["self"],
                                           head_fill=masks.get("cross_fill"), logits=vocab is None), vocab)
            total = (scores[:, None] + torch.log_softmax(logits[:, -1].float(), dim=-1)).flatten()  # (B*V,)
            best = total.topk(live)
            last = t == n_max - 1 or deadline.expired()
            keep = []
            for score, flat in zip(best.values.tolist(), best.indices.tolist()):
                row, tok = divmod(flat, V)
                tok = tok if vocab is None else int(vocab[0][tok])
                seq = hyps[row] + [tok]
                if tok == eos or last:
                    finished.append((score / len(seq) ** LENGTH_NORMALISE, seq))
                    if tok != eos:
                        stopped = "deadline" if t < n_max - 1 else "max_tokens"
                else:
                    keep.append((row, tok, score, seq))
            live = beam - len(finished)
            if live <= 0 or not keep:
                break
            keep = keep[:live]
            state = state.select(torch.tensor([k[0] for k in keep]))
            hyps = [k[3] for k in keep]
            scores = torch.tensor([k[2] for k in keep])
            feed = torch.tensor([[k[1]] for k in keep])
        return max(finished, key=lambda f: f[0])[1], stopped

    def _teacher(self, memory, masks, ids: list[int], attentions: bool):
        """Feed [start] + ids[:-1] at once; score ids. -> (ids, logprobs, tops, cross, self)."""
        target = torch.tensor(ids, dtype=torch.long)
        feed = torch.cat([self._start_ids(), target[None, :-1]], dim=1)
        vocab = masks.get("vocab")
        out = self.net.step(feed, self.net.start(memory), head_mask=masks["cross"], self_head_mask=masks["self"],
                            head_fill=masks.get("cross_fill"), need_weights=attentions, need_self=attentions,
                            logits=vocab is None)
        logp = torch.log_softmax(self._logits(out, vocab)[0].float(), dim=-1)   # (n_tgt, vocab or shortlist)
        tops = logp.topk(min(TOP_K, logp.shape[-1]), dim=-1)
        # a beam over the shortlist only ever picks shortlisted pieces: their column in it
        column = target if vocab is None else torch.searchsorted(vocab[0], target)
        top_ids = tops.indices if vocab is None else vocab[0][tops.indices]
        cross = torch.cat([out.cross[j] for j in range(len(self.net.decoder))]) if attentions else None
        self_att = torch.cat([out.self_att[j] for j in range(len(self.net.decoder))]) if out.self_att else None
        return target, logp.gather(1, column[:, None])[:, 0], (tops.values, top_ids), cross, self_att

    # ---------------------------------------------------------------- bookkeeping
    def fingerprint(self) -> str:
        """SHA-256 of every parameter and buffer: shows a shared model was never changed."""
        return weights_fingerprint(self.net)

    def num_params(self) -> int:
        return count_params(self.net)

