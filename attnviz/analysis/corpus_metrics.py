"""Label-free metrics of a masked (pruned) model against the full one, item by item and over a corpus.

`output(model, item, head_mask)` runs one item through the model's public call and keeps small,
picklable figures (never a vocabulary x length tensor); `compare(kind, full, pruned)` scores one
item; `summarise(kind, rows, fulls, pruneds, labels)` gives each metric over the corpus with a 95 %
confidence interval: a percentile bootstrap over the items (BOOTSTRAP resamples drawn with
numpy's default generator seeded by `seed`, so the same corpus and seed give the same interval).
Corpus-level metrics (perplexity pooled over tokens, nearest-neighbour agreement, corpus chrF,
Spearman with labels) are recomputed on each resample.

Per kind: lm — top-1 agreement, KL(full || pruned) over the full model's top-K next tokens and one
bucket for the rest (a lower bound of the whole KL, by the data-processing inequality), perplexity
of both; encoder — embedding cosine, nearest-neighbour agreement within the corpus; translator —
exact match and chrF (sacrebleu) of the pruned output against the full model's; speech — WER
(jiwer, lower-cased, punctuation removed) against the full model's transcript, and 1 - WER; vision —
CLS cosine and saliency IoU. Labels (a score per item) are compared by Spearman correlation with
each model's per-item score: lm the mean log-likelihood per token, encoder the cosine of a
sentence pair ("a<TAB>b"), translator and speech the mean log-probability of the output.
"""
from __future__ import annotations

import re

import jiwer
import numpy as np
import pandas as pd
import sacrebleu
import torch
from PIL import Image

from attnviz.analysis.corpus import PAIR, CorpusLimits
from attnviz.analysis.vision import saliency_iou
from attnviz.core.transformer import sentence_embedding

TOP_K = 64            # next-token candidates kept per position (KL's buckets)
BOOTSTRAP = 1000      # resamples for the confidence intervals
LEVEL = 0.95
SALIENCY_THRESHOLD = 0.5
PRIMARY = {"lm": "top1", "encoder": "cosine", "translator": "chrf", "speech": "word_accuracy",
           "vision": "cls_cosine"}
METRICS = {"lm": ["top1", "kl", "perplexity_pruned", "perplexity_full"],
           "encoder": ["cosine", "nn_agreement"],
           "translator": ["chrf", "exact_match", "corpus_chrf", "chrf_native", "exact_match_native",
                          "corpus_chrf_native", "full_matches_native"],
           "speech": ["word_accuracy", "wer"],
           "vision": ["cls_cosine", "saliency_iou"]}
MAX_TOKENS = CorpusLimits().max_tokens_per_row
# What a translator's pruned output is scored against: the full model's output, the package's own
# native engine's (an independent implementation of the same weights), or both side by side.
REFERENCES = ("full", "native", "both")
NATIVE = "_native"      # the suffix of the metrics against the native engine


def check_reference(kind: str, reference: str) -> str:
    if reference not in REFERENCES:
        raise ValueError(f"unknown reference {reference!r}; choose one of {', '.join(REFERENCES)}")
    if reference != "full" and kind != "translator":
        raise ValueError(f"only translators have a native engine to score against; a {kind} model is "
                         "scored against its full (unpruned) self: use reference 'full'")
    return reference


def metric_names(kind: str, reference: str = "full") -> list[str]:
    """The corpus metrics of a model kind against `reference` ("both": full's, then native's)."""
    check_reference(kind, reference)
    names = METRICS[kind]
    if kind != "translator":
        return list(names)
    full = [m for m in names if not m.endswith(NATIVE)]
    native = [m for m in names if m.endswith(NATIVE)]
    return {"full": full, "native": native, "both": full + native}[reference]


def primary(kind: str, reference: str = "full") -> str:
    """The metric a curve follows by default (against the native engine when that is the only reference)."""
    return PRIMARY[kind] + NATIVE if reference == "native" else PRIMARY[kind]


def model_kind(model) -> str:
    """"lm" | "encoder" | "translator" | "speech" | "vision"."""
    return model.kind


# ---------------------------------------------------------------- one item
def item_ids(model, text: str, max_tokens: int) -> tuple[torch.Tensor, int]:
    """The item's token ids cut to `max_tokens` (the last, special, token kept for an encoder)."""
    ids, _ = model.encode_text(text)
    cut = max(0, len(ids) - max_tokens)
    if cut:
        ids = ids[:max_tokens] if model.next_token else torch.cat([ids[:max_tokens - 1], ids[-1:]])
    return ids, cut


def lm_figures(logits: torch.Tensor, ids: torch.Tensor, cut: int) -> dict:
    """A language model's figures of one text from its logits (n, V) (`corpus_batch` reads the same)."""
    lp = logits.float().log_softmax(-1)                                  # (n, V), dropped below
    top_lp, top_ids = lp.topk(min(TOP_K, lp.shape[-1]), dim=-1)
    nll = -lp[:-1].gather(-1, ids[1:, None])[:, 0]
    return dict(kind="lm", top_ids=top_ids.numpy().astype(np.int32), top_logprobs=top_lp.numpy(),
                nll=nll.numpy(), cut=cut, score=float(-nll.mean()) if len(nll) else float("nan"))


def encoder_figures(embeddings: list[np.ndarray], cut: int) -> dict:
    """An encoder's figures of one text from its embedding (a sentence pair: two)."""
    out = dict(kind="encoder", embedding=embeddings[0], cut=cut, score=float("nan"))
    if len(embeddings) == 2:
        out["pair"] = embeddings[1]
        out["score"] = float(embeddings[0] @ embeddings[1])
    return out


def _lm_output(model, text, head_mask, max_tokens) -> dict:
    ids, cut = item_ids(model, text, max_tokens)
    tr = model.trace(ids, head_mask=head_mask, attentions=False)
    return lm_figures(tr.logits, ids, cut)


def _embedding(model, text, head_mask, max_tokens) -> tuple[np.ndarray, int]:
    ids, cut = item_ids(model, text, max_tokens)
    tr = model.trace(ids, head_mask=head_mask, attentions=False)
    return sentence_embedding(tr.hidden).numpy(), cut


def _encoder_output(model, text, head_mask, max_tokens) -> dict:
    embs = [_embedding(model, p, head_mask, max_tokens) for p in text.split(PAIR)[:2]]
    return encoder_figures([e for e, _ in embs], sum(c for _, c in embs))


def _translator_output(model, text, head_mask, max_tokens) -> dict:
    src, _, cut = model.source(text)
    if len(src) > max_tokens:
        cut += len(src) - max_tokens
        src = torch.cat([src[:max_tokens - 1], src[-1:]])
    tr = model.translate(src, head_mask=head_mask, attentions=False)
    lp = tr.logprobs
    return dict(kind="translator", text=tr.text, cut=cut, stopped=tr.stopped,
                score=float(lp.float().mean()) if lp is not None and len(lp) else float("nan"))


def _speech_output(model, samples, head_mask) -> dict:
    tr = model.transcribe(np.asarray(samples, dtype=np.float32), head_mask, cut=True)
    return dict(kind="speech", text=tr.text, stopped=tr.stopped,
                score=float(tr.logprobs.float().mean()) if len(tr.logprobs) else float("nan"))


def _vision_output(model, image, head_mask) -> dict:
    picture = Image.fromarray(np.asarray(image, dtype=np.uint8)) if not hasattr(image, "convert") else image
    tr = model.trace(picture, head_mask=head_mask, attentions=False)
    out = dict(kind="vision", cls=tr.hidden[0].float().numpy(), score=float("nan"))
    if tr.saliency is not None:  # only the thresholded map is needed for the IoU
        out["salient"] = (tr.saliency >= SALIENCY_THRESHOLD).numpy()
    return out


def output(model, item, head_mask=None, *, max_tokens: int = MAX_TOKENS) -> dict:
    """The figures of one item under `head_mask` (None: the full model) that `compare` needs:
    small numpy arrays and strings, deterministic for a given model, item and mask. Text items
    are cut to `max_tokens` tokens (`cut` says how many went)."""
    kind = model_kind(model)
    with torch.inference_mode():
        if kind == "lm":
            return _lm_output(model, str(item), head_mask, max_tokens)
        if kind == "encoder":
            return _encoder_output(model, str(item), head_mask, max_tokens)
        if kind == "translator":
            return _translator_output(model, str(item), head_mask, max_tokens)
        if isinstance(item, str):
            raise ValueError(f"a {kind} model reads {'audio' if kind == 'speech' else 'images'}, not text")
        if kind == "speech":
            return _speech_output(model, item, head_mask)
        return _vision_output(model, item, head_mask)


# ---------------------------------------------------------------- one item, compared
def _logsumexp(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[..., 0]


def lm_kl(full: dict, pruned: dict) -> np.ndarray:
    """KL(full || pruned) per position over the full model's top-K tokens plus one bucket for the
    rest. A token missing from the pruned run's own top-K takes that run's K-th log-probability
    (at least as likely as any token it did not keep), so the figure stays a lower bound."""
    f_ids, f_lp = full["top_ids"], full["top_logprobs"].astype(np.float64)
    p_ids, p_lp = pruned["top_ids"], pruned["top_logprobs"].astype(np.float64)
    n, k = f_ids.shape
    match = f_ids[:, :, None] == p_ids[:, None, :]                     # (n, k, k)
    found = match.any(-1)
    q = np.where(found, (match * p_lp[:, None, :]).sum(-1), p_lp[:, -1:])
    q_mass = np.exp(_logsumexp(q))
    # stand-ins may overshoot: keep q a distribution (rows without stand-ins stay exact)
    scale = np.where(~found.all(-1) & (q_mass > 1.0), q_mass, 1.0)
    q = q - np.log(scale)[:, None]
    p_rest = np.clip(1.0 - np.exp(f_lp).sum(-1), 0.0, 1.0)
    q_rest = np.clip(1.0 - np.exp(q).sum(-1), 1e-12, 1.0)
    kl = (np.exp(f_lp) * (f_lp - q)).sum(-1)
    kl += np.where(p_rest > 0, p_rest * (np.log(np.maximum(p_rest, 1e-300)) - np.log(q_rest)), 0.0)
    return np.maximum(kl, 0.0)


def _normalised(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


def word_error_rate(reference: str, hypothesis: str) -> float:
    """jiwer's WER on lower-cased text without punctuation; two empty texts: 0, against an empty
    reference: 1 if anything was heard."""
    ref, hyp = _normalised(reference), _normalised(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    return float(jiwer.wer(ref, hyp))


def chrf(reference: str, hypothesis: str) -> float:
    """sacrebleu's sentence chrF (character 6-grams, beta 2) on a 0-1 scale; equal texts: 1."""
    if reference == hypothesis:
        return 1.0
    return float(sacrebleu.sentence_chrf(hypothesis, [reference]).score) / 100.0


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    den = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / den) if den > 0 else float("nan")


def compare(kind: str, full: dict, pruned: dict) -> dict[str, float]:
    """Per-item metrics of the pruned output against the full one (`output`'s dicts)."""
    if kind not in PRIMARY:
        raise ValueError(f"unknown model kind {kind!r}; choose one of {sorted(PRIMARY)}")
    if full.get("kind") != kind or pruned.get("kind") != kind:
        raise ValueError(f"both outputs must be of a {kind} model")
    if kind == "lm":
        if full["top_ids"].shape != pruned["top_ids"].shape:
            raise ValueError("the two outputs are of different texts")
        n_tok = len(full["nll"])
        nll_f, nll_p = float(full["nll"].sum()), float(pruned["nll"].sum())
        return dict(top1=float((full["top_ids"][:, 0] == pruned["top_ids"][:, 0]).mean()),
                    kl=float(lm_kl(full, pruned).mean()), tokens=float(n_tok), nll_full=nll_f, nll_pruned=nll_p,
                    perplexity_full=float(np.exp(min(nll_f / max(n_tok, 1), 700.0))),
                    perplexity_pruned=float(np.exp(min(nll_p / max(n_tok, 1), 700.0))),
                    score_full=full["score"], score_pruned=pruned["score"])
    if kind == "encoder":
        return dict(cosine=_cosine(full["embedding"], pruned["embedding"]),
                    score_full=full["score"], score_pruned=pruned["score"])
    if kind == "translator":
        out = dict(chrf=chrf(full["text"], pruned["text"]), exact_match=float(full["text"] == pruned["text"]))
        if "native" in full:   # the native engine's translation of the same item (see corpus_runs.masks_task)
            out.update(chrf_native=chrf(full["native"], pruned["text"]),
                       exact_match_native=float(full["native"] == pruned["text"]),
                       full_matches_native=float(full["native"] == full["text"]))
        return dict(out, score_full=full["score"], score_pruned=pruned["score"])
    if kind == "speech":
        wer = word_error_rate(full["text"], pruned["text"])
        return dict(wer=wer, word_accuracy=1.0 - wer, score_full=full["score"], score_pruned=pruned["score"])
    out = dict(cls_cosine=_cosine(full["cls"], pruned["cls"]))
    if "salient" in full and "salient" in pruned:
        out["saliency_iou"] = saliency_iou(full["salient"].astype(np.float32), pruned["salient"].astype(np.float32))
    return out


# ---------------------------------------------------------------- over the corpus
def nn_agreement(full: np.ndarray, pruned: np.ndarray) -> np.ndarray:
    """Per item (rows of the [S, d] embeddings): 1 when its nearest other item under the pruned
    embeddings is the one under the full embeddings."""
    if len(full) < 2:
        return np.ones(len(full))

    def nearest(e):
        e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(1)
    return (nearest(np.asarray(full, np.float64)) == nearest(np.asarray(pruned, np.float64))).astype(float)


def _spearman(labels, scores) -> float:
    labels, scores = np.asarray(labels, float), np.asarray(scores, float)
    ok = np.isfinite(labels) & np.isfinite(scores)
    if ok.sum() < 3 or np.ptp(labels[ok]) == 0 or np.ptp(scores[ok]) == 0:
        return float("nan")
    from scipy import stats   # scipy.stats loads scipy.ndimage: only runs with labels pay for it
    return float(stats.spearmanr(labels[ok], scores[ok]).statistic)


CHRF = sacrebleu.CHRF()


def _per_item(kind: str, rows: pd.DataFrame, fulls, pruneds) -> dict[str, np.ndarray]:
    """Per-item arrays every corpus figure is a function of, so a bootstrap resample only indexes
    them (nearest neighbours are found once, in the whole corpus: a resample's duplicates would be
    each other's neighbours)."""
    cols = {c: rows[c].to_numpy(dtype=float) for c in rows.columns if pd.api.types.is_numeric_dtype(rows[c])}
    if kind == "encoder":
        cols["nn_agreement"] = nn_agreement(np.stack([f["embedding"] for f in fulls]),
                                            np.stack([p["embedding"] for p in pruneds]))
    if kind == "translator":
        hyps = [p["text"] for p in pruneds]
        for suffix, field_ in (("", "text"), (NATIVE, "native")):
            if not all(field_ in f for f in fulls):
                continue
            refs = [f[field_] for f in fulls]
            # sacrebleu's own sufficient statistics per sentence: corpus chrF of any resample is their sum's
            cols["chrf_stats" + suffix] = np.asarray(CHRF._extract_corpus_statistics(hyps, [refs]), dtype=float)
            cols["same_text" + suffix] = np.asarray([r == h for r, h in zip(refs, hyps)], dtype=float)
    return cols


def _statistics(kind: str, cols: dict[str, np.ndarray], labels, names: list[str]) -> dict:
    """Every corpus-level figure (of `names`) of one (re)sample of the per-item arrays."""
    out = {m: float(cols[m].mean()) for m in names if m in cols}
    if kind == "lm":
        tokens = max(float(cols["tokens"].sum()), 1.0)
        out["perplexity_full"] = float(np.exp(min(cols["nll_full"].sum() / tokens, 700.0)))
        out["perplexity_pruned"] = float(np.exp(min(cols["nll_pruned"].sum() / tokens, 700.0)))
    for suffix in ("", NATIVE):
        if "corpus_chrf" + suffix in names and "chrf_stats" + suffix in cols:
            out["corpus_chrf" + suffix] = 1.0 if cols["same_text" + suffix].all() else \
                float(CHRF._compute_score_from_stats(list(cols["chrf_stats" + suffix].sum(0))).score) / 100.0
    if labels is not None and "score_full" in cols:
        out["spearman_full"] = _spearman(labels, cols["score_full"])
        out["spearman_pruned"] = _spearman(labels, cols["score_pruned"])
    return out


def summarise(kind: str, rows: pd.DataFrame, fulls: list[dict], pruneds: list[dict],
              labels: list[float] | None = None, seed: int = 0, reference: str = "full") -> pd.DataFrame:
    """Columns metric, value, ci_low, ci_high, n: each metric over the corpus (`rows`: compare()'s
    columns, one row per item, in the order of `fulls` / `pruneds` / `labels`) with its 95 %
    percentile-bootstrap interval over items (seeded, so deterministic), widened where needed to
    hold the value itself (a ratio such as pooled perplexity can fall just outside its resamples').
    `reference` (translators): the metrics against the full model, the native engine or both; the
    native ones need each full output's "native" text."""
    if kind not in PRIMARY:
        raise ValueError(f"unknown model kind {kind!r}; choose one of {sorted(PRIMARY)}")
    rows = rows.reset_index(drop=True)
    n = len(rows)
    if n == 0 or len(fulls) != n or len(pruneds) != n or (labels is not None and len(labels) != n):
        raise ValueError(f"summarise needs one row, full and pruned output (and label) per item; got "
                         f"{n} rows, {len(fulls)} full, {len(pruneds)} pruned outputs")
    names = metric_names(kind, reference)
    if reference != "full" and not all("native" in f for f in fulls):
        raise ValueError("scoring against the native engine needs its translation of every item")
    labels = None if labels is None else np.asarray(labels, dtype=float)
    cols = _per_item(kind, rows, fulls, pruneds)
    value = _statistics(kind, cols, labels, names)
    value = {m: value[m] for m in [*names, *value] if m in value}    # the table lists metric_names' order
    rng = np.random.default_rng(seed)
    draws = {m: [] for m in value}
    for _ in range(BOOTSTRAP if n > 1 else 0):
        pick = rng.integers(0, n, n)
        got = _statistics(kind, {c: a[pick] for c, a in cols.items()}, None if labels is None else labels[pick],
                          names)
        for m in value:
            draws[m].append(got[m])
    table = []
    tail = (1 - LEVEL) / 2 * 100
    for m, v in value.items():
        d = np.asarray(draws[m], dtype=float)
        d = d[np.isfinite(d)]
        if len(d) and np.isfinite(v):
            lo, hi = np.percentile(d, [tail, 100 - tail])
            lo, hi = min(float(lo), v), max(float(hi), v)
        else:
            lo = hi = v
        table.append(dict(metric=m, value=v, ci_low=lo, ci_high=hi, n=n))
    return pd.DataFrame(table, columns=["metric", "value", "ci_low", "ci_high", "n"])
