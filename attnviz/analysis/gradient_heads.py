"""The toys' head measures on a pretrained text model, over the bundled evaluation text: how
concentrated |dloss/dhead mask| is over heads, and whether any head collapses onto itself.

The gradient is `importance.gradient_importance`'s raw score, summed over windows of the text: a
language model's next-token cross-entropy; for a sentence encoder, whose loss (1 - cos to the
full embedding) has zero gradient at the full mask, its second-order estimate of the loss rise.
The text is cut to `max_tokens` tokens and the run stops at `max_seconds` (and whenever
`should_stop()` is true): a large model stays bounded.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.analysis import importance
from attnviz.toys import head_measures

MAX_TOKENS = 128   # of the evaluation text: one window, a few seconds of backward pass on SmolLM2


@dataclass(frozen=True)
class PretrainedHeads:
    model_key: str
    objective: str                               # what was differentiated
    measure: str                                 # the same in a few words, for a sentence
    concentration: head_measures.Concentration
    collapse: head_measures.Collapse
    tokens: int                                  # content tokens of the evaluation text used
    windows: int                                 # windows measured (of `total`)
    total: int


def pretrained_heads(model, max_tokens: int = MAX_TOKENS, max_seconds: float | None = None,
                     should_stop=None, text: str | None = None) -> PretrainedHeads:
    """Gradient concentration and collapse of `model` on the evaluation text (or `text`)."""
    if int(max_tokens) < 8:
        raise ValueError("use at least 8 tokens of the evaluation text")
    data = importance.eval_windows(model, text, max_tokens=int(max_tokens), window=int(max_tokens))
    result = importance.gradient_importance(model, data, should_stop=should_stop, max_seconds=max_seconds)
    if result.done == 0:
        raise ValueError(f"the gradient measure stopped ({result.stopped}) before its first window; "
                         "allow more time or fewer tokens")
    alive = ~torch.isnan(result.raw)
    grad = head_measures.concentration(result.raw, alive)
    with torch.inference_mode():
        out = model.net(input_ids=data.ids[:1], need_weights=True, logits=False)
    collapse = head_measures.Collapse(head_measures.diagonal_mass(out.attentions, causal=model.cfg.causal))
    measure = head_measures.GRADIENT if model.next_token else \
        "the second-order estimate of each head's loss rise (the encoder's gradient is 0 at the full mask)"
    return PretrainedHeads(model.info.key, result.objective, measure, grad, collapse, data.n_tokens, result.done,
                           result.total)
