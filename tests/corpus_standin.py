"""A stand-in for the corpus modules (attnviz.analysis.corpus, corpus_metrics) while they are built
elsewhere: the smallest code that meets their interface, installed under their names only when the
real modules are missing. Also a Dask worker preload (`dask worker --preload tests/corpus_standin.py`),
so worker processes see the same modules."""
from __future__ import annotations

import importlib
import sys
import types
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from attnviz.core.transformer import sentence_embedding


@dataclass(frozen=True)
class CorpusLimits:
    max_rows: int = 2000
    max_bytes: int = 5_000_000
    max_chars_per_row: int = 2000
    max_tokens_per_row: int = 128


@dataclass
class Corpus:
    key: str
    kind: str
    items: list
    labels: list | None = None
    notes: list = field(default_factory=list)
    source: str = "tests"
    licence: str = "test text"


SENTENCES = ["The cat sat on the mat.", "Stock markets fell sharply today.", "A kitten is resting on a rug.",
             "I love you very much.", "The train leaves at noon.", "Rain is expected over the hills tonight."]


def bundled_corpora() -> dict:
    return {"test-sentences": "six short English sentences (tests)"}


def default_corpus(model_kind: str) -> str:
    return "test-sentences"


def open_corpus(source, *, data=None, column=None, label_column=None, limits=CorpusLimits()) -> Corpus:
    if data is None:
        if source not in bundled_corpora():
            raise ValueError(f"no bundled corpus {source!r}")
        return Corpus(source, "text", list(SENTENCES))
    lines = [x for x in data[:limits.max_bytes].decode("utf-8").splitlines() if x.strip()]
    if not lines:
        raise ValueError(f"{source} holds no text")
    return Corpus(source, "text", lines[:limits.max_rows])


PRIMARY = {"lm": "top1", "encoder": "cosine"}


def model_kind(model) -> str:
    return "lm" if model.cfg.task == "lm" else "encoder"


def output(model, item, head_mask=None) -> dict:
    tr = model.trace(item, head_mask=head_mask, attentions=False)
    if model_kind(model) == "lm":
        return dict(top1=tr.logits.argmax(-1).numpy())
    return dict(embedding=sentence_embedding(tr.hidden).numpy().astype(np.float32))


def compare(kind: str, full: dict, pruned: dict) -> dict:
    if kind == "lm":
        return dict(top1=float((full["top1"] == pruned["top1"]).mean()))
    return dict(cosine=float(np.dot(full["embedding"], pruned["embedding"])))


def summarise(kind, rows: pd.DataFrame, fulls, pruneds, labels=None, seed: int = 0) -> pd.DataFrame:
    out = []
    for col in rows.columns:
        x = rows[col].to_numpy(float)
        half = 1.96 * x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else float("nan")
        out.append(dict(metric=col, value=x.mean(), ci_low=x.mean() - half, ci_high=x.mean() + half, n=len(x)))
    return pd.DataFrame(out)


def install():
    """Put the stand-ins under the real modules' names where those do not exist yet."""
    me = sys.modules[__name__]
    for name, attrs in (("attnviz.analysis.corpus", ("Corpus", "CorpusLimits", "bundled_corpora",
                                                      "default_corpus", "open_corpus")),
                        ("attnviz.analysis.corpus_metrics", ("PRIMARY", "model_kind", "output", "compare",
                                                             "summarise"))):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            module = types.ModuleType(name)
            for attr in attrs:
                setattr(module, attr, getattr(me, attr))
            sys.modules[name] = module


install()
