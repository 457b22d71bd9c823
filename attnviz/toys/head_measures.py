"""Two measures of heads, for the toys and (through `attnviz.analysis.gradient_heads`) for
pretrained models: how concentrated the gradient is over heads, and attention collapse.

Gradient concentration: with a mask m multiplying each head's output, the share of heads whose
|dL/dm_h|, largest first, add up to 90 % of the total. The often-repeated "30 % of heads carry
90 % of the gradient" holds on a model when that share is at most 30 %.

Collapse: a head collapses onto itself when each query puts (almost) all its weight on its own
position. Its diagonal mass is the mean over queries of the weight on the key at the query's own
position; a head counts as collapsed above 0.9. In a causal model the first query sees only
itself, so it is left out: it has no choice to measure.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.base import names
from attnviz.toys.tasks import EVAL_SEED, ToyModel
from attnviz.toys.training import answer_loss

CARRIED = 0.9            # the share of the gradient the claim is about
CLAIM = 0.3              # ... and the share of heads it says carry it
COLLAPSE = 0.9           # diagonal mass above which a head counts as collapsed


@dataclass(frozen=True)
class Concentration:
    gradient: torch.Tensor   # [L, H] |dL/dm| per head (0 for heads that are off)
    needed: int              # heads whose gradient, largest first, reaches `carried` of the total
    heads: int               # heads measured (those on)
    carried: float = CARRIED

    @property
    def share(self) -> float:
        return self.needed / self.heads

    @property
    def claim_holds(self) -> bool:
        return self.share <= CLAIM


def concentration(gradient, alive=None, carried: float = CARRIED) -> Concentration:
    """How many heads carry `carried` of the total |gradient| (largest first). `alive` [L, H]
    bool: the heads to count (default all)."""
    g = torch.as_tensor(gradient, dtype=torch.float64).abs().nan_to_num(0.0)
    alive = torch.ones_like(g, dtype=torch.bool) if alive is None else torch.as_tensor(alive).bool()
    if g.dim() != 2 or alive.shape != g.shape:
        raise ValueError(f"gradient must be [layers, heads] with a mask of the same shape; got {tuple(g.shape)}")
    if not 0 < carried <= 1:
        raise ValueError("the carried share must lie in (0, 1]")
    values = torch.sort(g[alive], descending=True).values
    total = float(values.sum())
    if values.numel() == 0 or total <= 0:
        raise ValueError("no head has a gradient to measure (every head off, or a zero gradient)")
    # a relative tolerance (float32 gradients) so that an exact 90 % is not missed by rounding
    reached = values.cumsum(0) >= carried * total * (1 - 1e-6)
    needed = int(reached.nonzero()[0]) + 1
    return Concentration(torch.where(alive, g, 0.0).float(), needed, int(values.numel()), carried)


def batch_mask_gradient(net, task, inputs, answers, variant, head_mask: torch.Tensor) -> torch.Tensor:
    """[L, H] |d answer loss / d head mask| of a toy network on one batch, at `head_mask`."""
    mask = head_mask.clone().requires_grad_(True)
    with torch.enable_grad():
        loss, _ = answer_loss(net, task, inputs, answers, variant, mask)
        (grad,) = torch.autograd.grad(loss, mask)
    return grad.abs()


def mask_gradient(model: ToyModel, head_mask=None, n: int = 500, seed: int = EVAL_SEED) -> torch.Tensor:
    """[L, H] |d loss / d head mask| of a toy on `n` held-out prompts, at `head_mask` (default all on)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    start = torch.ones(L, H) if head_mask is None else model.check_head_mask(head_mask).float()
    inputs, answers, _ = model.task.sample(n, torch.Generator().manual_seed(seed))
    return batch_mask_gradient(model.net, model.task, inputs, answers, model.variant, start)


def toy_concentration(model: ToyModel, head_mask=None, n: int = 500) -> Concentration:
    alive = None if head_mask is None else torch.as_tensor(head_mask) > 0
    return concentration(mask_gradient(model, head_mask, n), alive)


def diagonal_mass(weights, causal: bool = False) -> torch.Tensor:
    """[L, H] mean weight each head's queries put on their own position. `weights`: [L, H, T, T],
    [L, B, H, T, T], or {layer: (B, H, T, T)} as a network's forward returns them."""
    if isinstance(weights, dict):
        weights = torch.stack([weights[i] for i in sorted(weights)])
    w = torch.as_tensor(weights).float()
    if w.dim() == 4:
        w = w[:, None]
    if w.dim() != 5 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must be [layers, (batch,) heads, n, n]; got {tuple(w.shape)}")
    diag = w.diagonal(dim1=-2, dim2=-1)                         # (L, B, H, T)
    if causal:
        if diag.shape[-1] < 2:
            raise ValueError("a causal model needs at least two tokens to measure collapse")
        diag = diag[..., 1:]
    return diag.mean((1, 3))


@dataclass(frozen=True)
class Collapse:
    diagonal: torch.Tensor   # [L, H] diagonal mass
    threshold: float = COLLAPSE

    @property
    def collapsed(self) -> torch.Tensor:
        return self.diagonal > self.threshold

    @property
    def count(self) -> int:
        return int(self.collapsed.sum())

    @property
    def heads(self) -> int:
        return self.diagonal.numel()

    def names(self) -> list[str]:
        return [names.head_name(i, h) for i, h in self.collapsed.nonzero().tolist()]

    def most(self) -> tuple[str, float]:
        flat = int(self.diagonal.argmax())
        return names.head_name(*divmod(flat, self.diagonal.shape[1])), float(self.diagonal.flatten()[flat])


def toy_collapse(model: ToyModel, n: int = 256, seed: int = EVAL_SEED) -> Collapse:
    inputs, _, _ = model.task.sample(n, torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        out = model.net(input_ids=inputs, need_weights=True, variants=model.variant)
    return Collapse(diagonal_mass(out.attentions, causal=model.cfg.causal))


# ---------------------------------------------------------------- sentences from the numbers
GRADIENT = "|∂loss/∂head mask|"


def concentration_sentence(what: str, c: Concentration, measure: str = GRADIENT) -> str:
    verdict = "holds" if c.claim_holds else "does not hold"
    return (f"{what}: {c.needed} of {c.heads} heads ({c.share:.1%}) carry {c.carried:.0%} of "
            f"{measure}, so “{CLAIM:.0%} of heads carry {CARRIED:.0%} of the gradient” "
            f"{verdict} here.")


def collapse_sentence(what: str, c: Collapse) -> str:
    head, mass = c.most()
    if c.count:
        found = f"{c.count} of {c.heads} heads collapsed ({', '.join(c.names())})"
    else:
        found = f"no head of {c.heads} collapsed"
    return (f"{what}: {found} — more than {c.threshold:.0%} of a head's attention on each query's own "
            f"position; the most self-attending head is {head}, at {mass:.1%}.")
