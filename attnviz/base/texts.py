"""Texts bundled with the package: a public-domain evaluation text and example sentences.

Both live in attnviz/data/ (see its README.md for sources and licences) and are read with
importlib.resources, so they work from a wheel as well as from a checkout.
"""

from __future__ import annotations

import functools
from importlib.resources import files

_DATA = files("attnviz") / "data"


@functools.cache
def eval_text() -> str:
    """Chapters I–II of Alice's Adventures in Wonderland (public domain), ~4,200 words.

    Paragraphs are separated by one blank line; ~5,500 tokens for both bundled tokenizers, so
    callers take windows of it (e.g. for perplexity or agreement with an unpruned model).
    """
    return (_DATA / "eval_en.txt").read_text(encoding="utf-8")


@functools.cache
def _seed_sentences() -> tuple[str, ...]:
    lines = (_DATA / "seed_sentences.txt").read_text(encoding="utf-8").splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def seed_sentences() -> list[str]:
    """Short example inputs: pronoun resolution (English, Chinese), emoji, facts, repetition."""
    return list(_seed_sentences())  # a fresh list: callers may change it without harm
