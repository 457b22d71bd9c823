"""Which heads matter on an evaluation text: gradient importance and single-head ablation.

Gradient importance follows Michel, Levy & Neubig (2019, "Are Sixteen Heads Really Better than
One?"): a mask m multiplies each head's output; the importance of head h is E_x |dL/dm_h| at the
current mask, accumulated over the text's windows and L2-normalised per layer.

Losses (label-free, so any text works):
- language models: next-token cross-entropy of the text itself.
- sentence encoders (no LM head): the distance of the masked model's L2-normalised mean-pooled
  embedding e(m) from the full model's, L = 1 - cos = 1/2 |e(m) - e(1)|^2. At m = 1 this loss sits at
  its minimum, so dL/dm = 0 there and a first-order score says nothing. We use the second-order
  Taylor estimate of the loss increase when head h is removed, -g_h m_h + 1/2 m_h^2 (J^T J)_hh,
  where J = de/dm. At the minimum the Gauss-Newton matrix J^T J IS the Hessian (the residual is
  zero), so at m = 1 this is the exact second-order estimate of 1 - cos after removing that head.
  diag(J^T J) comes from a few random orthonormal probes v (Hutchinson): E[(v^T J)_h^2] = |J_h|^2.

Single-head ablation measures the same thing directly: the change of the metric when that head
alone is removed (one forward pass per head, so slower, and exact).

Long runs take `progress(done, total, partial)` and `should_stop() -> bool`; a stopped run returns
what it has, marked `complete=False`. Every run also stops at a time budget (`max_seconds`), which
can never exceed the server's `LIMITS.max_importance_seconds` (env ATTNVIZ_MAX_IMPORTANCE_SECONDS):
asking for more is a ValueError, asking for nothing gets the limit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd
import torch
import torch.nn.functional as F

from attnviz.analysis import head_ablation
from attnviz.base import limits
from attnviz.base.jobs import Deadline
from attnviz.base.limits import LIMITS
from attnviz.base.texts import eval_text
from attnviz.core.transformer import sentence_embedding

Progress = Callable[[int, int, object], None]
ShouldStop = Callable[[], bool]

GRAD_PROBES = 8         # random probes per window for the encoder's Gauss-Newton diagonal


# ---------------------------------------------------------------- evaluation windows
@dataclass
class EvalSet:
    ids: torch.Tensor      # [W, T] token ids, special tokens included, every window the same length
    n_tokens: int          # content tokens used (without special tokens)
    available: int         # content tokens the text had (before the max_tokens cap)

    @property
    def n_windows(self) -> int:
        return self.ids.shape[0]


def plain_ids(tokenizer, text: str) -> list[int]:
    """Token ids of `text` without the special tokens the tokenizer frames a text with."""
    try:
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    except TypeError:  # a minimal tokenizer (the toys) without that switch
        return tokenizer(text)["input_ids"]


def _special_frame(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a text (BERT: [CLS] .. [SEP])."""
    plain, framed = plain_ids(tokenizer, "x"), tokenizer("x")["input_ids"]
    for i in range(len(framed) - len(plain) + 1):
        if framed[i:i + len(plain)] == plain:
            return framed[:i], framed[i + len(plain):]
    return [], []


def eval_windows(model, text: str | None = None, max_tokens: int = 256, window: int = 128) -> EvalSet:
    """Cut a text (default: the bundled evaluation text) into equal windows of `window` tokens,
    special tokens included, using at most `max_tokens` content tokens. A text shorter than one
    window gives one window of its own length."""
    if model.tokenizer is None:
        raise ValueError("this model has no tokenizer; head importance needs a text model")
    text = eval_text() if text is None else text
    if not text or not text.strip():
        raise ValueError("the evaluation text is empty; paste a text or choose the bundled one")
    max_tokens = int(min(max_tokens, LIMITS.max_importance_tokens))  # LM reference log-probs: 2 bytes x vocab a token
    prefix, suffix = _special_frame(model.tokenizer)
    # Tokenize at most ~8 characters per wanted token: long pastes stay fast.
    content = plain_ids(model.tokenizer, text[: max_tokens * 8 + 64])
    available = len(content)
    if available < 2:
        raise ValueError(f"the evaluation text has {available} token(s); at least two are needed "
                         "(a language model predicts each token from the ones before it). "
                         "Paste a longer text or use the bundled one.")
    window = int(min(window, model.max_tokens))
    per_window = window - len(prefix) - len(suffix)
    if per_window < 2:
        raise ValueError(f"window of {window} tokens is too short; choose at least {len(prefix) + len(suffix) + 2}")
    content = content[:max_tokens]
    if len(content) < per_window:  # one short window
        rows = [content]
    else:
        rows = [content[i:i + per_window] for i in range(0, len(content) - per_window + 1, per_window)]
    ids = torch.tensor([prefix + r + suffix for r in rows], dtype=torch.long)  # (W, T)
    return EvalSet(ids=ids, n_tokens=sum(len(r) for r in rows), available=available)


# ---------------------------------------------------------------- reference and metrics
@dataclass
class Reference:
    """The full model's outputs on the windows, computed once and compared against."""
    logprobs: torch.Tensor | None = None   # LM: [W, T, V] float16 log-probabilities
    top1: torch.Tensor | None = None       # LM: [W, T] argmax
    embedding: torch.Tensor | None = None  # encoder: [W, d] L2-normalised mean-pooled hidden


def _check_mask(model, head_mask) -> torch.Tensor:
    m = model.check_head_mask(head_mask)
    return model.kept.float() if m is None else m * model.kept.float()


def reference(model, data: EvalSet, batch: int = 2) -> Reference:
    """Full-model (all remaining heads) outputs on every window."""
    mask = model.kept.float()
    outs = []
    with torch.inference_mode():
        for ids in data.ids.split(batch):
            out = model.net(input_ids=ids, head_mask=mask, logits=model.next_token)
            outs.append(out.logits.float().log_softmax(-1) if model.next_token else sentence_embedding(out.hidden))
    if model.next_token:
        lp = torch.cat(outs)
        return Reference(logprobs=lp.half(), top1=lp.argmax(-1))
    return Reference(embedding=torch.cat(outs))


def evaluate(model, data: EvalSet, head_mask=None, ref: Reference | None = None,
             batch: int = 2, ablation: str = "zero", means=None) -> dict[str, float]:
    """Metrics of the masked model on the windows. LM: loss (nats/token), perplexity, KL(full ||
    masked) per token and top-1 agreement with the full model; encoder: embedding cosine.
    `ablation`: heads off output 0 ("zero") or their mean ("mean", `means` from
    analysis.ablation.head_means, computed when not given)."""
    mask = _check_mask(model, head_mask)
    fill = head_ablation.fill(mask, ablation, head_ablation.resolve_means(model, ablation, means))
    ref = ref or reference(model, data, batch)
    lm = model.next_token
    sums = dict(nll=0.0, kl=0.0, agree=0.0, cos=0.0)
    n_pred = n_pos = 0
    with torch.inference_mode():
        for w0, ids in zip(range(0, data.n_windows, batch), data.ids.split(batch)):
            out = model.net(input_ids=ids, head_mask=mask, logits=lm, head_fill=fill)
            if lm:
                lp = out.logits.float().log_softmax(-1)                      # (B, T, V)
                sums["nll"] += float(-lp[:, :-1].gather(-1, ids[:, 1:, None]).sum())
                ref_lp = ref.logprobs[w0:w0 + len(ids)].float()
                sums["kl"] += float((ref_lp.exp() * (ref_lp - lp)).sum())
                sums["agree"] += float((lp.argmax(-1) == ref.top1[w0:w0 + len(ids)]).sum())
                n_pred += ids[:, 1:].numel()
                n_pos += ids.numel()
            else:
                e = sentence_embedding(out.hidden)
                sums["cos"] += float((e * ref.embedding[w0:w0 + len(ids)]).sum())
    if lm:
        loss = sums["nll"] / max(n_pred, 1)
        return dict(loss=loss, perplexity=math.exp(min(loss, 700.0)), kl=sums["kl"] / n_pos,
                    top1=sums["agree"] / n_pos)
    return dict(cosine=sums["cos"] / data.n_windows)


def primary_metric(model) -> str:
    """The metric curves and ablation rank by: perplexity for LMs, embedding cosine for encoders."""
    return "perplexity" if model.next_token else "cosine"


def damage(model, metrics: dict[str, float]) -> float:
    """One number that grows as the model gets worse: loss (LM) or 1 - cosine (encoder)."""
    return metrics["loss"] if model.next_token else 1.0 - metrics["cosine"]


# ---------------------------------------------------------------- importance
@dataclass
class Importance:
    method: str                 # gradient | ablation
    objective: str              # what was differentiated or measured
    scores: torch.Tensor        # [L, H] ranking score, higher = more important; NaN = absent / not computed
    raw: torch.Tensor           # [L, H] before per-layer normalisation (gradient); same as scores (ablation)
    done: int                   # windows (gradient) or heads (ablation) processed
    total: int
    baseline: dict = field(default_factory=dict)   # metrics of the model under the starting mask
    details: pd.DataFrame | None = None            # ablation: metrics with each head removed
    stopped: str | None = None                     # why an incomplete run ended: "stopped" | "time limit"
    max_seconds: float | None = None               # the time budget the run had
    ablation: str = "zero"                         # how a head off is removed: zero | mean (analysis.ablation)

    @property
    def complete(self) -> bool:
        return self.done >= self.total

    def ranking(self, normalised: bool = True) -> torch.Tensor:
        """[L, H] what to rank by: the per-layer normalised score (Michel et al.) or the raw one,
        which stays comparable across layers (the encoder's raw score estimates the loss rise)."""
        return self.scores if normalised else self.raw

    def table(self, normalised: bool = True) -> pd.DataFrame:
        """Ranked table (most important first) of the heads that have a score."""
        L, H = self.scores.shape
        df = pd.DataFrame(dict(layer=torch.arange(L).repeat_interleave(H).numpy(),
                               head=torch.arange(H).repeat(L).numpy(),
                               score=self.scores.flatten().numpy(), raw=self.raw.flatten().numpy()))
        if self.details is not None:
            df = df.merge(self.details, on=["layer", "head"], how="left")
        df = df.dropna(subset=["score"]).sort_values("score" if normalised else "raw", ascending=False,
                                                     kind="stable")
        df.insert(0, "rank", range(1, len(df) + 1))
        return df.reset_index(drop=True)

    def keep_top(self, fraction: float, alive: torch.Tensor | None = None,
                 normalised: bool = True) -> torch.Tensor:
        """BoolTensor [L, H]: the top `fraction` of scored heads (at least one kept)."""
        return keep_top(self.ranking(normalised), fraction, alive)


def keep_top(scores: torch.Tensor, fraction: float, alive: torch.Tensor | None = None) -> torch.Tensor:
    if not 0 <= fraction <= 1:
        raise ValueError("fraction must lie between 0 and 1")
    alive = ~torch.isnan(scores) if alive is None else alive & ~torch.isnan(scores)
    n_alive = int(alive.sum())
    if n_alive == 0:
        raise ValueError("no head has an importance score yet; compute importance first")
    k = max(1, round(fraction * n_alive))
    flat = torch.where(alive, scores, torch.tensor(float("-inf"))).flatten()
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep[torch.argsort(flat, descending=True, stable=True)[:k]] = True
    return keep.view_as(scores)


def normalise_per_layer(raw: torch.Tensor) -> torch.Tensor:
    """Michel et al.: divide each layer's scores by their L2 norm (NaN entries ignored)."""
    filled = torch.nan_to_num(raw, nan=0.0)
    norm = filled.norm(dim=1, keepdim=True).clamp_min(1e-20)
    return raw / norm


def _stopped(should_stop: ShouldStop | None) -> bool:
    return bool(should_stop is not None and should_stop())


def time_budget(max_seconds: float | None = None) -> float:
    """Seconds one importance or pruning-curve run may take: `max_seconds`, which must lie in
    (0, LIMITS.max_importance_seconds]; None gives that limit."""
    cap = float(limits.LIMITS.max_importance_seconds)
    if max_seconds is None:
        return cap
    try:
        seconds = float(max_seconds)
    except (TypeError, ValueError):
        raise ValueError(f"the time budget must be a number of seconds; got {max_seconds!r}") from None
    if not seconds > 0:
        raise ValueError(f"the time budget must be positive; got {max_seconds!r}")
    if seconds > cap:
        raise ValueError(f"a time budget of {seconds:g} s is more than this server allows ({cap:g} s, "
                         "ATTNVIZ_MAX_IMPORTANCE_SECONDS): choose at most that")
    return seconds


class Stop:
    """should_stop for a long run: the caller's own check, or the time budget running out.
    `reason` says which stopped it ("stopped" | "time limit"), None while neither has."""

    def __init__(self, should_stop: ShouldStop | None = None, max_seconds: float | None = None):
        self.should_stop = should_stop
        self.deadline = Deadline(time_budget(max_seconds))
        self.reason: str | None = None

    def __call__(self) -> bool:
        if self.reason is None:
            if _stopped(self.should_stop):
                self.reason = "stopped"
            elif self.deadline.expired():
                self.reason = "time limit"
        return self.reason is not None


def gradient_importance(model, data: EvalSet, head_mask=None, ref: Reference | None = None, *,
                        probes: int = GRAD_PROBES, seed: int = 0, progress: Progress | None = None,
                        should_stop: ShouldStop | None = None, max_seconds: float | None = None,
                        ablation: str = "zero", means=None) -> Importance:
    """Michel et al. importance at the given mask (default: every remaining head on), one window
    at a time. Heads that are masked out or pruned get NaN. With mean ablation a head's gate
    moves its output between the head's own and its mean (the gradient is taken there)."""
    stop = Stop(should_stop, max_seconds)
    start = _check_mask(model, head_mask)
    means = head_ablation.resolve_means(model, ablation, means)
    alive = start > 0
    lm = model.next_token
    if not lm and ref is None:
        ref = reference(model, data)
    gen = torch.Generator().manual_seed(seed)
    acc = torch.zeros_like(start)
    objective = ("|d cross-entropy / d mask| (next-token loss of the text)" if lm else
                 "second-order estimate of the rise of 1 - cos(embedding, full embedding) "
                 "(gradient + Gauss-Newton diagonal, Hutchinson probes)")
    result = Importance("gradient", objective, torch.full_like(start, float("nan")),
                        torch.full_like(start, float("nan")), 0, data.n_windows,
                        max_seconds=stop.deadline.seconds, ablation=ablation)
    for w in range(data.n_windows):
        if stop():
            result.stopped = stop.reason
            break
        ids = data.ids[w:w + 1]
        mask = start.clone().requires_grad_(True)
        with torch.enable_grad():
            out = model.net(input_ids=ids, head_mask=mask, logits=lm, head_fill=head_ablation.fill(mask, ablation, means))
            if lm:
                loss = F.cross_entropy(out.logits[0, :-1].float(), ids[0, 1:])
                (grad,) = torch.autograd.grad(loss, mask)
                acc += grad.abs()
            else:
                e = sentence_embedding(out.hidden)[0]                              # (d,)
                loss = 1 - (e * ref.embedding[w]).sum()
                (g,) = torch.autograd.grad(loss, mask, retain_graph=True)
                k = min(probes, e.numel())
                # orthonormal probes scaled so that E[(v^T J)^2] = |J|^2 exactly when k = d
                q, _ = torch.linalg.qr(torch.randn(e.numel(), k, generator=gen))
                # all probes in one batched backward pass: (k, d) -> (k, L, H)
                (gv,) = torch.autograd.grad(e, mask, grad_outputs=q.T.contiguous(), is_grads_batched=True)
                gn = gv.pow(2).sum(0) * (e.numel() / k)
                acc += -g * start + 0.5 * start.pow(2) * gn
        result.done = w + 1
        raw = torch.where(alive, acc / result.done, torch.tensor(float("nan")))
        result.raw = raw
        result.scores = normalise_per_layer(raw)
        if progress is not None:
            progress(result.done, result.total, result)
    return result


def ablation_importance(model, data: EvalSet, head_mask=None, ref: Reference | None = None, *,
                        batch: int = 2, progress: Progress | None = None,
                        should_stop: ShouldStop | None = None, max_seconds: float | None = None,
                        ablation: str = "zero", means=None) -> Importance:
    """For every head still on: the metrics with that head alone removed, and the rise of the
    damage (LM: loss in nats/token; encoder: 1 - cosine) as its score."""
    stop = Stop(should_stop, max_seconds)
    start = _check_mask(model, head_mask)
    ref = ref or reference(model, data, batch)
    means = head_ablation.resolve_means(model, ablation, means)
    base = evaluate(model, data, start, ref, batch, ablation, means)
    heads = [(i, h) for i, h in zip(*torch.nonzero(start > 0, as_tuple=True))]
    raw = torch.full_like(start, float("nan"))
    rows = []
    result = Importance("ablation", "rise of " + ("the next-token loss (nats/token)" if model.next_token
                        else "1 - cosine to the full embedding") + " when the head alone is removed",
                        raw, raw, 0, len(heads), baseline=base, max_seconds=stop.deadline.seconds,
                        ablation=ablation)
    for i, h in heads:
        if stop():
            result.stopped = stop.reason
            break
        mask = start.clone()
        mask[i, h] = 0
        metrics = evaluate(model, data, mask, ref, batch, ablation, means)
        raw[i, h] = damage(model, metrics) - damage(model, base)
        rows.append(dict(layer=int(i), head=int(h), **metrics))
        result.done += 1
        result.details = pd.DataFrame(rows)
        if progress is not None:
            progress(result.done, result.total, result)
    return result


def head_importance(model, data: EvalSet, method: str = "gradient", head_mask=None,
                    ref: Reference | None = None, **kw) -> Importance:
    if method == "gradient":
        return gradient_importance(model, data, head_mask, ref, **kw)
    if method == "ablation":
        return ablation_importance(model, data, head_mask, ref, **kw)
    raise ValueError(f"unknown importance method {method!r}; choose 'gradient' or 'ablation'")
