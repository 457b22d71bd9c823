"""Corpus figures of several texts and several head masks per forward pass (language models and
sentence encoders), equal to `corpus_metrics.output` text by text up to float rounding.

Why: one text per forward reads every weight again from memory for a few dozen rows; a batch of
texts (right-padded, the padding masked as the model's own attention mask does) times a batch of
head masks (a mask per batch row, `iter_layers`' [B, L, H]) turns the products into matrix x
matrix. The full model runs once per text and keeps every block's input, so a masked row starts at
the first layer its mask changes: the layers before it are shared, never recomputed.

Padding: right padding, so every real token keeps its positions 0..n-1 (learned, sinusoidal,
rotary and ALiBi positions alike). A causal model needs no mask for it (no real token looks at a
later position); an encoder masks the padded keys (`Transformer.shared`'s padding mask) and
pools only the real tokens. Only the real tokens' figures are read, so padding changes nothing.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from attnviz.analysis import corpus_metrics
from attnviz.analysis.corpus import PAIR
from attnviz.core.transformer import sentence_embedding

ROW_TOKENS = 2048     # rows x padded length of one pass: matrix x matrix products, activations of tens of MB
HEAD_TOKENS = 512     # an LM head's logits are made this many tokens at a time (tokens x vocab floats)
BATCH_KINDS = ("lm", "encoder")


def batchable(model) -> bool:
    """Whether a model's corpus figures come from `masked_outputs` / `gradient_raws` (its kind reads
    text through the one Transformer)."""
    return corpus_metrics.model_kind(model) in BATCH_KINDS


def padded(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id rows, right-padded with 0 -> ids (B, n), attention mask (B, n) (1 = real token)."""
    n = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    mask = torch.zeros(len(seqs), n, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)], mask[i, :len(s)] = s, 1
    return ids, mask


def _sequences(model, texts: list[str], max_tokens: int):
    """Each text's token sequences (an encoder's sentence pair: two) as [(text, part, ids, cut)]."""
    out = []
    for t, text in enumerate(texts):
        parts = str(text).split(PAIR)[:2] if not model.next_token else [str(text)]
        for p, part in enumerate(parts):
            ids, cut = corpus_metrics.item_ids(model, part, max_tokens)
            out.append((t, p, ids, cut))
    return out


def _first_changed(mask: torch.Tensor | None, L: int) -> int:
    """The first layer whose heads a mask [L, H] switches (L: none)."""
    if mask is None:
        return L
    off = (mask < 1).any(1).nonzero()
    return int(off[0]) if len(off) else L


def _figures(model, x: torch.Tensor, lengths: list[int], seqs: list[torch.Tensor]) -> list:
    """The last block's output of rows (R, n, d) -> per row: an LM's figures dict (without `cut`)
    or an encoder's embedding, read from the real tokens only."""
    net = model.net
    if not model.next_token:
        hidden, _ = net.finish(x, logits=False)
        return [sentence_embedding(hidden[r, :n]).numpy() for r, n in enumerate(lengths)]
    real = torch.cat([x[r, :n] for r, n in enumerate(lengths)])          # (sum n, d), padding dropped
    pieces = [net.finish(chunk[None])[1][0] for chunk in real.split(HEAD_TOKENS)]
    logits = torch.cat(pieces).split(lengths)
    return [corpus_metrics.lm_figures(lg, ids, 0) for lg, ids in zip(logits, seqs)]


def _run_rows(model, states, mask, starts, rows, masks, seqs, lengths):
    """Rows [(sequence, mask index)] from the full run's kept block inputs, all from the earliest
    layer any of them changes; padding columns past the longest row are dropped."""
    n = max(lengths[s] for s, _ in rows)
    start = min(starts[m] for _, m in rows)
    pick = torch.tensor([s for s, _ in rows])
    x = states[start][pick, :n]
    head_mask = torch.stack([masks[m] for _, m in rows])                 # (R, L, H)
    attention = None if model.cfg.causal else mask[pick, :n]
    out = model.net.run_blocks(x, start, head_mask=head_mask, attention_mask=attention).x
    return _figures(model, out, [lengths[s] for s, _ in rows], [seqs[s] for s, _ in rows])


def masked_outputs(model, texts: list[str], masks: list[torch.Tensor | None], *,
                   max_tokens: int = corpus_metrics.MAX_TOKENS) -> list[list[dict]]:
    """`corpus_metrics.output(model, text, mask)` for every text and mask (None: the full model),
    out[text][mask], with every text padded into shared passes and the masks as a batch dimension."""
    if not batchable(model):
        raise ValueError(f"a {corpus_metrics.model_kind(model)} model's figures are made an item at a time")
    net, L = model.net, int(model.cfg.n_layers)
    parts = _sequences(model, texts, max_tokens)
    seqs = [ids for _, _, ids, _ in parts]
    lengths = [len(s) for s in seqs]
    ids, mask = padded(seqs)
    starts = [_first_changed(m, L) for m in masks]
    with torch.inference_mode():
        full_states, per_row = [], max(1, ROW_TOKENS // ids.shape[1])
        for chunk in range(0, len(seqs), per_row):       # the full model: every block's input kept
            sl = slice(chunk, chunk + per_row)
            x = net.embed_text(ids[sl])
            run = net.run_blocks(x, states=True, attention_mask=None if model.cfg.causal else mask[sl])
            full_states.append(run.states + [run.x])
        states = [torch.cat([c[i] for c in full_states]) for i in range(L + 1)]
        full = _figures(model, states[L], lengths, seqs)
        got: dict[tuple[int, int], object] = {}
        rows = [(s, m) for m in range(len(masks)) if starts[m] < L for s in range(len(seqs))]
        rows.sort(key=lambda r: (starts[r[1]], lengths[r[0]]))
        batch = []
        for row in rows + [None]:
            if batch and (row is None or (len(batch) + 1) * max(lengths[s] for s, _ in batch + [row]) > ROW_TOKENS):
                for key, value in zip(batch, _run_rows(model, states, mask, starts, batch, masks, seqs, lengths)):
                    got[key] = value
                batch = []
            if row is not None:
                batch.append(row)
    return [[_assemble(model, parts, t, [got.get((s, m), full[s]) for s in range(len(parts))])
             for m in range(len(masks))] for t in range(len(texts))]


def _assemble(model, parts, t: int, per_seq: list) -> dict:
    """One text's `output` dict from its sequences' figures."""
    mine = [(p, per_seq[s], cut) for s, (tt, p, _, cut) in enumerate(parts) if tt == t]
    if model.next_token:
        (_, figures, cut), = mine
        return dict(figures, cut=cut)
    return corpus_metrics.encoder_figures([e for _, e, _ in mine], sum(c for _, _, c in mine))


def gradient_raws(model, windows: list[torch.Tensor], seeds: list[int],
                  probes: int) -> list[np.ndarray]:
    """`importance.gradient_importance`'s raw [L, H] of each one-window text, all texts in one
    padded pass: a mask per row, so each row's loss reaches only its own mask's gradient."""
    net, lm = model.net, model.next_token
    L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
    ids, attention = padded(windows)
    lengths = [len(w) for w in windows]
    start = model.kept.float()
    mask = start.expand(len(windows), L, H).clone().requires_grad_(True)
    with torch.enable_grad():
        out = net(input_ids=ids, head_mask=mask, logits=lm, attention_mask=None if lm else attention)
        if lm:
            loss = sum(F.cross_entropy(out.logits[b, :n - 1].float(), ids[b, 1:n]) for b, n in enumerate(lengths))
            (grad,) = torch.autograd.grad(loss, mask)
            raws = [grad[b].abs() for b in range(len(windows))]
        else:
            e = torch.stack([sentence_embedding(out.hidden[b, :n]) for b, n in enumerate(lengths)])  # (B, d)
            loss = (1 - (e * e.detach()).sum(-1)).sum()   # at m = 1 the full embedding is e itself
            (g,) = torch.autograd.grad(loss, mask, retain_graph=True)
            d = e.shape[-1]
            k = min(probes, d)
            qs = [torch.linalg.qr(torch.randn(d, k, generator=torch.Generator().manual_seed(s)))[0] for s in seeds]
            probe = torch.stack([q.T for q in qs], 1).contiguous()          # (k, B, d): each row its own probes
            (gv,) = torch.autograd.grad(e, mask, grad_outputs=probe, is_grads_batched=True)   # (k, B, L, H)
            gn = gv.pow(2).sum(0) * (d / k)
            raws = [-g[b] * start + 0.5 * start.pow(2) * gn[b] for b in range(len(windows))]
    alive = start > 0
    return [torch.where(alive, r, torch.tensor(float("nan"))).detach().numpy().astype(np.float64) for r in raws]
