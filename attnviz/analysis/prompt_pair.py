"""Two prompts side by side: the same head on both, and how much each head's pattern differs.

The difference of one head is the mean, over query positions, of the total-variation distance
between the two attention rows (half the L1 distance: 0 = the same row, 1 = no key in common).
When both prompts have as many tokens, positions are compared one to one. Otherwise (e.g. "too
big" vs "too small" tokenized into different numbers of pieces) both patterns are pooled to WORDS
(a query word's rows averaged, a key word's columns summed) and the words are aligned with
difflib's matcher: equal words, and replaced runs of the same length, are paired; the rest is left
out and said.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

import pandas as pd
import torch

from attnviz.base import memory, names
from attnviz.base.limits import LIMITS

_WORD = re.compile(r"\S+")


@dataclass
class Pair:
    tokens: tuple[list[str], list[str]]
    attentions: tuple[torch.Tensor, torch.Tensor]   # [L, H, n_a, n_a], [L, H, n_b, n_b]
    words: tuple[list[str], list[str]]
    word_of: tuple[list[int], list[int]]             # token -> its word
    by_word: bool                                    # compared word by word (the token counts differ)
    matched: list[tuple[int, int]]                   # aligned (word of a, word of b), or token pairs
    difference: torch.Tensor                         # [L, H] in [0, 1]
    note: str | None = None

    def top(self, k: int = 10) -> list[tuple[int, int, float]]:
        flat = self.difference.flatten()
        H = self.difference.shape[1]
        return [(int(i) // H, int(i) % H, float(flat[i])) for i in flat.argsort(descending=True)[:k]]


def words_of(model, text: str, tokens: list[str], ids: list[int], special: list[bool]) -> tuple[list[str], list[int]]:
    """The whitespace-separated words of `text` and the word of each token (its characters' word,
    from the tokenizer's offsets). A special token is a word of its own; without offsets each
    token is one."""
    tok = model.tokenizer
    offsets = None
    if getattr(tok, "is_fast", False):
        enc = tok(text, return_offsets_mapping=True, truncation=True, max_length=model.max_tokens)
        if list(enc["input_ids"]) == list(ids):
            offsets = enc["offset_mapping"]
    if offsets is None:
        return list(tokens), list(range(len(tokens)))
    spans = [m.span() for m in _WORD.finditer(text)]
    words, word_of, index = [], [], {}
    for t, (start, end) in enumerate(offsets):
        if special[t] or start == end:
            word_of.append(len(words))
            words.append(tokens[t])
            continue
        w = next((j for j, (s, e) in enumerate(spans) if e > start and s < end),
                 next((j for j, (s, _) in enumerate(spans) if s >= start), len(spans) - 1))
        if w not in index:
            index[w] = len(words)
            words.append(text[spans[w][0]:spans[w][1]])
        word_of.append(index[w])
    return words, word_of


def pool_words(att: torch.Tensor, word_of: list[int], n_words: int) -> torch.Tensor:
    """[L, H, n, n] -> [L, H, W, W]: a query word's rows averaged, a key word's columns summed."""
    member = torch.zeros(len(word_of), n_words)
    member[torch.arange(len(word_of)), torch.tensor(word_of)] = 1            # (n, W)
    summed = att @ member                                                   # (L, H, n, W)
    return (member.T @ summed) / member.sum(0).clamp_min(1)[:, None]       # (L, H, W, W)


def align(words_a: list[str], words_b: list[str]) -> tuple[list[tuple[int, int]], int]:
    """Word pairs (equal words, and replaced runs of equal length) and how many words were left out."""
    matcher = difflib.SequenceMatcher(None, [w.lower() for w in words_a], [w.lower() for w in words_b],
                                      autojunk=False)
    pairs, left = [], 0
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op == "equal" or (op == "replace" and a1 - a0 == b1 - b0):
            pairs += list(zip(range(a0, a1), range(b0, b1)))
        else:
            left += (a1 - a0) + (b1 - b0)
    return pairs, left


def row_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[L, H, q, k] twice -> [L, H]: mean over rows of half the L1 distance."""
    return 0.5 * (a - b).abs().sum(-1).mean(-1)


def compare_prompts(model, text_a: str, text_b: str, head_mask=None) -> Pair:
    # Both prompts are tokenised and their captures priced before either is traced: a trace holds
    # every layer's [H, n, n] weights, 72 GB for SmolLM2 at 8,192 tokens.
    ids = [model.inputs(text)["ids"] for text in (text_a, text_b)]
    for j, x in enumerate(ids):
        if len(x) > LIMITS.readout_max_tokens:
            raise ValueError(f"the {('first', 'second')[j]} prompt has {len(x):,} tokens; two prompts take at most "
                             f"{LIMITS.readout_max_tokens:,} each. Shorten it.")
    cfg = model.cfg
    memory.plan_capture("two prompts", layers=cfg.n_layers, heads=cfg.n_heads, n=max(len(x) for x in ids), copies=2,
                        shorten="each prompt")
    traces = [(text, model.trace(x, head_mask=head_mask)) for text, x in zip((text_a, text_b), ids)]
    (ta, a), (tb, b) = traces
    wa, ia = words_of(model, ta, a.tokens, a.ids.tolist(), a.special.tolist())
    wb, ib = words_of(model, tb, b.tokens, b.ids.tolist(), b.special.tolist())
    if a.n == b.n:
        diff = row_distance(a.attentions.float(), b.attentions.float())
        return Pair((a.tokens, b.tokens), (a.attentions, b.attentions), (wa, wb), (ia, ib), False,
                    [(j, j) for j in range(a.n)], diff)
    pairs, left = align(wa, wb)
    if not pairs:
        raise ValueError("the two prompts have no word in common: nothing to compare position by position")
    pa, pb = pool_words(a.attentions.float(), ia, len(wa)), pool_words(b.attentions.float(), ib, len(wb))
    qa, qb = torch.tensor([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs])
    diff = row_distance(pa[:, :, qa][..., qa], pb[:, :, qb][..., qb])
    note = (f"The prompts have {a.n} and {b.n} tokens, so they are compared word by word: {len(pairs)} "
            f"aligned words" + (f", {left} word(s) without a partner left out" if left else "") + ".")
    return Pair((a.tokens, b.tokens), (a.attentions, b.attentions), (wa, wb), (ia, ib), True, pairs, diff, note)


def difference_frame(pair: Pair) -> pd.DataFrame:
    L, H = pair.difference.shape
    return pd.DataFrame([dict(head=names.head_name(i, h), layer=i, index=h, difference=float(pair.difference[i, h]))
                         for i in range(L) for h in range(H)])
