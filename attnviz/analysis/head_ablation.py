"""How a switched-off head is removed: zero ablation or mean ablation.

- **zero** (what a head mask does everywhere in attnviz): the head's output, before the output
  projection, is multiplied by 0.
- **mean**: the head's output is replaced by its mean over the evaluation text
  (`attnviz.base.texts.eval_text`, the first `MEAN_TOKENS` tokens), a constant that keeps the
  average signal a head adds and removes only what depends on this input. Zero ablation also
  removes the average, which later layers may rely on, so it overstates a head's importance.

Both go through the one forward loop: the mask multiplies the head's output and `head_fill`
([L, H, d_head] = (1 - mask) x mean) is added after it.
"""
from __future__ import annotations

import torch

from attnviz.base.texts import eval_text

MODES = ("zero", "mean")
MEAN_TOKENS = 512  # of the evaluation text: a few paragraphs, enough for a stable mean (~1 s on SmolLM2)


def check_mode(ablation: str) -> str:
    if ablation not in MODES:
        raise ValueError(f"ablation must be one of {', '.join(MODES)}; got {ablation!r}")
    return ablation


def eval_ids(model, n_tokens: int = MEAN_TOKENS) -> torch.Tensor:
    """The first n tokens of the evaluation text (within the model's positions)."""
    if model.tokenizer is None:
        raise ValueError("mean ablation needs a model with a tokenizer (the mean is over the evaluation text)")
    ids, _ = model.encode_text(eval_text()[:20 * n_tokens])  # ~4 characters a token: enough text, cut below
    return ids[:min(n_tokens, model.max_tokens)]


def head_means(model, ids: torch.Tensor | None = None, check=None) -> torch.Tensor:
    """Every head's mean output over the positions of `ids` (default: the evaluation text):
    [L, H, d_head], zero for heads pruned away."""
    cfg = model.cfg
    ids = eval_ids(model) if ids is None else model.check_ids(ids)
    means = torch.zeros(cfg.n_layers, cfg.n_heads, cfg.d_head)
    net = model.net
    with torch.inference_mode():
        x = net.embed_text(ids[None])
        for step in net.iter_blocks(x, head_outputs=range(cfg.n_layers), check=check,
                                    variants=getattr(model, "variant", None)):
            means[step.layer, net.blocks[step.layer].attn.heads] = step.heads[0].float().mean(1)  # (h, n, dh) -> (h, dh)
    return means


def resolve_means(model, ablation: str, means: torch.Tensor | None = None, check=None) -> torch.Tensor | None:
    """The means a run with this ablation needs: None for zero ablation, the given ones, or
    (when none are given) `head_means(model)` over the evaluation text."""
    if check_mode(ablation) == "zero":
        return None
    return means if means is not None else head_means(model, check=check)


def fill(head_mask, ablation: str, means: torch.Tensor | None) -> torch.Tensor | None:
    """What `iter_blocks(head_fill=...)` takes for this mask: None for zero ablation (and for no mask),
    (1 - mask) x mean for mean ablation."""
    if check_mode(ablation) == "zero" or head_mask is None:
        return None
    if means is None:
        raise ValueError("mean ablation needs the heads' means (ablation.head_means(model))")
    mask = torch.as_tensor(head_mask, dtype=torch.float32)
    if tuple(means.shape[:2]) != tuple(mask.shape):
        raise ValueError(f"the means are for {tuple(means.shape[:2])} heads, the mask has {tuple(mask.shape)}")
    return (1 - mask)[..., None] * means


def logits(model, x, head_mask=None, ablation: str = "zero", means: torch.Tensor | None = None,
           check=None) -> torch.Tensor:
    """The model's logits [n, V] on `x` with the heads of `head_mask` off, removed by `ablation`."""
    mask = model.check_head_mask(head_mask)
    head_fill = fill(mask, ablation, means)
    ids = model.inputs(x)["ids"]
    net = model.net
    with torch.inference_mode():
        out = net.run_blocks(net.embed_text(ids[None]), head_mask=mask, head_fill=head_fill, check=check,
                             variants=getattr(model, "variant", None))
        return net.finish(out.x)[1][0].float()


def describe(ablation: str) -> str:
    """The words a figure uses for its ablation."""
    return {"zero": "zero ablation (a head off outputs 0)",
            "mean": "mean ablation (a head off outputs its mean over the evaluation text)"}[check_mode(ablation)]
