"""The encoder-decoders' decoding loops, methods of `attnviz.core.translator.Seq2SeqModel` (`self`
is the model; a speech model's hooks, `_start_ids` and `adjust_logits`, apply): greedy (the block
runner's step, or its fused one-row path with the lexical shortlist's check), Marian's beam search,
and teacher forcing. Each step goes through `Seq2Seq.step` / `step_row`, i.e. the one forward loop.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnviz.core.seq2seq import DecoderState
from attnviz.core.translation_parts import self_matrix

TOP_K = 10                  # next-token candidates kept per step (the page's step-through)
BLOCK = 128                 # columns per block in the whole vocabulary's top-k search (32,000 = 250 x 128)
LENGTH_NORMALISE = 1.0      # beam: score / length^1.0, as Marian's --normalize 1.0 (eos counted)


@dataclass
class Decoded:
    """One decoding's target and what was read choosing it (greedy, beam or teacher-forced)."""
    ids: torch.Tensor                  # [n_tgt] the target, the end of sentence included
    logprobs: torch.Tensor             # [n_tgt] log-probability of each token when chosen
    top_logprobs: torch.Tensor         # [n_tgt, TOP_K] the best candidates at each step
    top_ids: torch.Tensor              # [n_tgt, TOP_K]
    cross: torch.Tensor | None         # [L_dec, H, n_tgt, n_src]
    self_att: torch.Tensor | None      # [L_dec, H, n_tgt, n_tgt] (attention decoders)
    stopped: str = "eos"               # eos | max_tokens | deadline | given


def opened(net, memory, start=None):
    """A fresh decoding state over `memory`: `start`'s encoder K/V reused when given (`net.start`
    computed them once for every pass over this encoder output), else computed now."""
    return net.start(memory) if start is None else start.fresh()


def greedy(self, memory, masks, n_max, deadline, attentions, cache, start=None):
    """Greedy decoding. Per step only the product and the argmax; log-probabilities and top
    candidates come from every step's logits at once after the loop. `start`: a `net.start(memory)`
    whose encoder K/V to reuse."""
    net, eos, vocab = self.net, self.cfg.eos_id, masks["vocab"]
    rows = net.row_state(memory, start) if cache and self._start_ids().shape[1] == 1 else None
    if rows is not None:
        return self._greedy_rows(masks, n_max, deadline, attentions, rows, memory.shape[1])
    state = opened(net, memory, start)
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
    return self._scored(ids, torch.stack(logit_rows), torch.stack(cols), vocab,
                        cross, self_matrix(self_rows), stopped)


def greedy_rows(self, masks, n_max, deadline, attentions, state, S):
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
    pieces = None if scored is None else scored[0].tolist()   # column -> token id, once per sentence
    # the shortlist's rows (n, d) as gathered: for ~500 rows the one-row product reads them as fast as a
    # transposed copy would, and the copy is not made; float32 (a byte layout per sentence costs more
    # than its products save)
    start_id = int(self._start_ids()[0, 0])
    head_mask, head_fill = masks["cross"], masks.get("cross_fill")
    ids, cols, hidden, logit_rows, carries = [], [], [], [], []
    t, done, stopped, full, maxima = 0, 0, "max_tokens", None, None   # done: steps checked against the whole vocabulary
    while True:
        while t < n_max:
            x = net.step_row(net.embed_row(start_id if t == 0 else ids[-1], t), state, head_mask=head_mask,
                             head_fill=head_fill, into=None if buf is None else buf[:, :, t:t + 1])   # x (1, d)
            hidden.append(x)
            if check:
                carries.append([layer["c"] for layer in state.layers])  # the state after step t: where a check resumes
            logits = (net.lm_head(x) if scored is None else F.linear(x, scored[1], scored[2]))[0].float()
            logit_rows.append(logits)
            col = int(logits.argmax())
            cols.append(col)
            ids.append(col if pieces is None else pieces[col])
            t += 1
            if ids[-1] == eos or deadline.expired():
                stopped = "eos" if ids[-1] == eos else "deadline"
                break
        if not check:
            logits, cols = torch.stack(logit_rows), torch.tensor(cols)
            break
        # the steps not yet checked, in one product over the whole vocabulary: (n - done, vocab)
        new = net.lm_head(torch.cat(hidden[done:])).float()
        full = new if done == 0 else torch.cat([full[:done], new])
        maxima = block_maxima(full)
        picks = row_argmax(full, maxima).tolist()
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
            logits, cols, maxima = full[:t], torch.tensor(picks[:t]), maxima[:t]
            break
    cross = None if buf is None else buf[:, :, :len(ids)].contiguous()   # [L, H, n_tgt, S]
    return self._scored(ids, logits, cols, vocab, cross, None, stopped, maxima)


def block_maxima(logits) -> torch.Tensor | None:
    """Each row's maximum in every block of BLOCK columns (n, V / BLOCK), or None where the rows
    are too narrow for blocks to pay (`row_argmax` and `summarise` then search every column)."""
    n, V = logits.shape
    return None if V % BLOCK or V < 8 * BLOCK else logits.view(n, V // BLOCK, BLOCK).amax(-1)


def row_argmax(logits, maxima=None) -> torch.Tensor:
    """logits.argmax(-1), the same columns (the first of equal maxima): over a wide row, the
    first block of BLOCK columns holding the row's maximum, then the first maximum in it (one
    vectorised pass of block maxima is several times cheaper than argmax over 32,000).
    `maxima`: the rows' `block_maxima`, when already found."""
    maxima = block_maxima(logits) if maxima is None else maxima
    if maxima is None:
        return logits.argmax(-1)
    n, V = logits.shape
    b = maxima.argmax(-1)
    return b * BLOCK + logits.view(n, V // BLOCK, BLOCK)[torch.arange(n), b].argmax(-1)


def summarise(logits, cols, k: int, maxima=None):
    """Logits (n, V) and each row's chosen column -> (the chosen columns' log-probabilities (n,),
    the top k log-probabilities (n, k) and their columns), exactly as log_softmax then topk give
    them. Over a wide row (the whole vocabulary) the top k are looked for only in the k blocks of
    BLOCK columns with the highest maxima: any other block's values are at most the k-th highest
    maximum, so none of them can be among the top k; several times cheaper than topk over 32,000.
    `maxima`: the logits' `block_maxima` when already found (a row's log-softmax is the row minus
    one number, and rounding keeps the order, so the same blocks hold the top k)."""
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(1, cols[:, None])[:, 0]
    n, V = logp.shape
    k = min(k, V)
    if V % BLOCK or V < 4 * k * BLOCK:
        top_v, top_i = logp.topk(k, dim=-1)
        return chosen, top_v, top_i
    blocks = logp.view(n, V // BLOCK, BLOCK)
    best = (blocks.amax(-1) if maxima is None else maxima).topk(k, dim=-1).indices   # (n, k) block numbers
    top_v, j = blocks.gather(1, best[..., None].expand(n, k, BLOCK)).view(n, k * BLOCK).topk(k, dim=-1)
    return chosen, top_v, best.gather(1, j // BLOCK) * BLOCK + j % BLOCK


def scored(self, ids: list[int], logits, cols, vocab, cross, self_att, stopped: str, maxima=None) -> Decoded:
    """Each step's logits (n, vocab or shortlist) and chosen columns -> the decoding, scored.
    `maxima`: the logits' `block_maxima`, when already found."""
    chosen, top_v, top_i = summarise(logits, cols, TOP_K, maxima)
    return Decoded(torch.tensor(ids), chosen, top_v, top_i if vocab is None else vocab[0][top_i],
                   cross, self_att, stopped)


def beam(self, memory, masks, beam: int, n_max: int, deadline, start=None) -> tuple[list[int], str]:
    """Marian's beam search: the beam shrinks by one for every hypothesis that ends; the best
    finished hypothesis by score / length^LENGTH_NORMALISE wins."""
    net, eos, vocab = self.net, self.cfg.eos_id, masks["vocab"]
    V = self.cfg.vocab_size if vocab is None else len(vocab[0])
    state: DecoderState = opened(net, memory, start)
    hyps, scores, feed = [[]], torch.zeros(1), self._start_ids()
    finished, live, stopped = [], beam, "eos"
    for t in range(n_max):
        logits = self._logits(net.step(feed, state, head_mask=masks["cross"], self_head_mask=masks["self"],
                                       head_fill=masks.get("cross_fill"), logits=vocab is None), vocab)
        step = logits[:, -1].float()
        if vocab is None and t == 0:  # one hypothesis yet: the model's first-step rule (a forced first token)
            step = self.adjust_logits(step[0], 0)[None]
        total = (scores[:, None] + torch.log_softmax(step, dim=-1)).flatten()  # (B*V,)
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


def teacher(self, memory, masks, ids: list[int], attentions: bool, start=None) -> Decoded:
    """Feed [start] + ids[:-1] at once; score ids (stopped: "given")."""
    target = torch.tensor(ids, dtype=torch.long)
    feed = torch.cat([self._start_ids(), target[None, :-1]], dim=1)
    vocab = masks.get("vocab")
    out = self.net.step(feed, opened(self.net, memory, start), head_mask=masks["cross"], self_head_mask=masks["self"],
                        head_fill=masks.get("cross_fill"), need_weights=attentions, need_self=attentions,
                        logits=vocab is None)
    # a beam over the shortlist only ever picks shortlisted pieces: their column in it
    column = target if vocab is None else torch.searchsorted(vocab[0], target)
    chosen, top_v, top_i = summarise(self._logits(out, vocab)[0].float(), column, TOP_K)   # (n_tgt, vocab or shortlist)
    top_ids = top_i if vocab is None else vocab[0][top_i]
    cross = torch.cat([out.cross[j] for j in range(len(self.net.decoder))]) if attentions else None
    self_att = torch.cat([out.self_att[j] for j in range(len(self.net.decoder))]) if out.self_att else None
    return Decoded(target, chosen, top_v, top_ids, cross, self_att, "given")
