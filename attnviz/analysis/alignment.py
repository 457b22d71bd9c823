"""Readouts of a `Translation`: word-level alignment from cross-attention, and how two
translations differ (word diff, first differing step).

Pieces are grouped into words the way SentencePiece writes them: a label starting with a space
(or "␣", or a raw piece's "▁" / "Ġ") opens a word; punctuation and the end of sentence are words
of their own, so "amo." aligns "amo" and "." separately.
"""
from __future__ import annotations

import difflib
import unicodedata

import torch

from attnviz.core.tokens import LEADING_SPACE_MARKS

WORD_START = LEADING_SPACE_MARKS
SPECIAL = ("</s>", "<s>", "<pad>", "<unk>")


def _is_punctuation(piece: str) -> bool:
    core = piece.lstrip("".join(WORD_START))
    return bool(core) and all(unicodedata.category(ch).startswith("P") for ch in core)


def word_groups(tokens: list[str]) -> tuple[list[str], list[list[int]]]:
    """(words, the token positions of each word)."""
    words, groups = [], []
    previous_closed = True
    for i, tok in enumerate(tokens):
        special = tok in SPECIAL
        punct = _is_punctuation(tok)
        starts = tok.startswith(WORD_START) or special or punct or previous_closed or not groups
        text = tok.lstrip("".join(WORD_START)) or tok
        if starts:
            words.append(text)
            groups.append([i])
        else:
            words[-1] += text
            groups[-1].append(i)
        previous_closed = special or punct
    return words, groups


def word_alignment(cross: torch.Tensor, source_tokens: list[str], target_tokens: list[str]):
    """cross [n_tgt, n_src] (one head or a head average) -> (target words, source words,
    [n_tgt_words, n_src_words]): attention mass on each source word (summed over its pieces),
    averaged over the target word's pieces. Rows still sum to 1."""
    if tuple(cross.shape) != (len(target_tokens), len(source_tokens)):
        raise ValueError(f"cross-attention is {tuple(cross.shape)}, expected "
                         f"({len(target_tokens)}, {len(source_tokens)})")
    src_words, src_groups = word_groups(source_tokens)
    tgt_words, tgt_groups = word_groups(target_tokens)
    m = cross.float()
    by_source = torch.stack([m[:, g].sum(-1) for g in src_groups], dim=-1)      # (n_tgt, Sw)
    matrix = torch.stack([by_source[g].mean(0) for g in tgt_groups])            # (Tw, Sw)
    return tgt_words, src_words, matrix


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first decoding step at which two token sequences differ (None when identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def word_diff(before: str, after: str) -> list[tuple[str, str]]:
    """[(kind, text)] with kind "same" | "removed" | "added", word by word."""
    a, b = before.split(), after.split()
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(("same", " ".join(a[i1:i2])))
            continue
        if i2 > i1:
            out.append(("removed", " ".join(a[i1:i2])))
        if j2 > j1:
            out.append(("added", " ".join(b[j1:j2])))
    return out
