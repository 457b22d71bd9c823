"""Training-time experiments on a toy transformer, each a change to the one training loop
(`training.train` with `training.Hooks`), each compared with the baseline at the same seed on
exact held-out accuracy.

- attention dropout 0.1 (the 'dropout:0.1' variant: active only while training);
- softmax temperature 0.5 and 2 ('temp:0.5', 'temp:2': scores divided by T, in training and after);
- the head-variance regulariser: loss + 0.01 · the variance of the attention weights across the
  heads of a layer (per batch element, query and key; mean over layers);
- dynamic head pruning: every few steps each head's share of |dloss/dhead mask| on a fixed probe
  batch is measured (|gradient| of 8 chunks of 32 prompts, summed: one batch's signed gradient
  cancels and swings from check to check); a head whose share, averaged over the last three checks,
  is under half an equal share is switched off through the head mask, for the rest of training and for
  evaluation (the last head of a layer stays);
- one key projection shared by every head of a layer (queries and values stay per head): a
  parametrization of the fused QKV weight, so the optimizer holds fewer parameters.

Every result also carries the trained toy's gradient concentration and collapse
(`attnviz.toys.head_measures`). Seeds fix the initialisation and every batch: reruns are exact.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from attnviz.base import names
from attnviz.toys import head_measures
from attnviz.toys.tasks import EVAL_SEED, Task, ToyModel
from attnviz.toys.training import Hooks, TrainSettings, train

# The experiments' toy: sort 8 digits, 2 layers x 4 heads of width 8 (d_model 32): small enough to
# train an experiment and its baseline within the Lab's budget, far enough from 100 % that a change
# shows.
SETTINGS = TrainSettings(task=Task("sort", 8), n_layers=2, n_heads=4, d_model=32, steps=200, batch_size=64)
EXPERIMENTS = {
    "baseline": "baseline (softmax, no change)",
    "dropout": "attention dropout 0.1",
    "temp:0.5": "temperature 0.5 (sharper attention)",
    "temp:2": "temperature 2 (flatter attention)",
    "variance": "head-variance regulariser 0.01",
    "pruning": "dynamic head pruning during training",
    "shared_k": "one key projection shared by all heads",
}
NO_EFFECT = 0.005         # accuracy changes under half a point read as no effect
PROBE_SEED = EVAL_SEED + 1  # the pruning probe batch: neither a training batch nor the held-out set
PROBE_SIZE, PROBE_CHUNK = 256, 32


@dataclass
class ExperimentResult:
    name: str                       # a key of EXPERIMENTS
    seed: int
    steps: int                      # steps asked for (`steps_done` fewer when stopped early)
    losses: list[float]             # the task's cross-entropy per step (any added term is in `penalties`)
    history: list[tuple[int, float]]  # (step, exact accuracy on 500 held-out prompts)
    exact: float                    # exact accuracy on the 2,000 held-out prompts, after training
    token: float
    params: int                     # trainable parameters
    concentration: head_measures.Concentration
    collapse: head_measures.Collapse
    stopped_early: bool = False
    steps_done: int = 0
    penalties: list[float] = field(default_factory=list)   # the regulariser's term per step
    pruned: dict[str, int] = field(default_factory=dict)   # head -> the step it went off
    head_mask: torch.Tensor | None = None
    model: ToyModel | None = None           # the trained toy (evaluated under `head_mask`)

    @property
    def label(self) -> str:
        return EXPERIMENTS[self.name]


def settings_for(steps: int = SETTINGS.steps, seed: int = 0, variant: str = "softmax") -> TrainSettings:
    if not 1 <= int(steps) <= 5000:
        raise ValueError("choose between 1 and 5,000 training steps")
    if not 0 <= int(seed) <= 10_000:
        raise ValueError("choose a seed between 0 and 10,000")
    return replace(SETTINGS, steps=int(steps), seed=int(seed), variant=variant)


def _run(name: str, s: TrainSettings, hooks: Hooks, progress, should_stop, penalties=None,
         pruned=None) -> ExperimentResult:
    every = max(10, s.steps // 10)
    res = train(s, progress, key=f"experiment:{name}:{s.seed}", eval_every=every, should_stop=should_stop,
                hooks=hooks)
    penalties = penalties or []
    losses = [loss - (penalties[i] if i < len(penalties) else 0.0) for i, loss in enumerate(res.losses)]
    model, mask = res.model, hooks.head_mask
    return ExperimentResult(name, s.seed, s.steps, losses, res.history, res.score.exact, res.score.token,
                            model.num_params(), head_measures.toy_concentration(model, mask),
                            head_measures.toy_collapse(model), res.stopped_early, res.steps_done, penalties,
                            pruned or {}, mask, model)


def baseline(s: TrainSettings, progress=None, should_stop=None) -> ExperimentResult:
    return _run("baseline", s, Hooks(), progress, should_stop)


def dropout(s: TrainSettings, progress=None, should_stop=None, p: float = 0.1) -> ExperimentResult:
    return _run("dropout", replace(s, variant=f"dropout:{p}"), Hooks(), progress, should_stop)


def temperature(s: TrainSettings, progress=None, should_stop=None, t: float = 2.0) -> ExperimentResult:
    name = f"temp:{t:g}"
    if name not in EXPERIMENTS:
        raise ValueError(f"the Lab compares temperatures 0.5 and 2; got {t:g}")
    return _run(name, replace(s, variant=name), Hooks(), progress, should_stop)


def head_variance(weights: dict) -> torch.Tensor:
    """Mean over layers of the variance across heads of the attention weights (per batch element,
    query and key)."""
    return torch.stack([w.var(dim=1, unbiased=False).mean() for w in weights.values()]).mean()


def variance_regulariser(s: TrainSettings, progress=None, should_stop=None,
                         weight: float = 0.01) -> ExperimentResult:
    terms: list[float] = []

    def penalty(weights: dict) -> torch.Tensor:
        term = weight * head_variance(weights)
        terms.append(float(term.detach()))
        return term

    return _run("variance", s, Hooks(penalty=penalty), progress, should_stop, penalties=terms)


def dynamic_pruning(s: TrainSettings, progress=None, should_stop=None, threshold: float = 0.5,
                    patience: int = 3, every: int | None = None, start: int | None = None) -> ExperimentResult:
    """A head goes off once its share of |dloss/dmask|, averaged over the last `patience` checks,
    is under `threshold` / (heads on); checks every `every` steps from step `start` (defaults: a
    twentieth of the steps, from a fifth of them: heads have to learn something first)."""
    if not 0 < threshold <= 1 or patience < 1:
        raise ValueError("the pruning threshold must lie in (0, 1] and the patience be at least 1 check")
    L, H = s.n_layers, s.n_heads
    mask, recent, pruned = torch.ones(L, H), [], {}
    every = every or max(1, s.steps // 20)
    start = s.steps // 5 if start is None else start
    inputs, answers, _ = s.task.sample(PROBE_SIZE, torch.Generator().manual_seed(PROBE_SEED))

    def after(step: int, net):
        if step < start or step % every:
            return
        grad = torch.zeros(L, H)
        for i in range(0, len(inputs), PROBE_CHUNK):
            grad += head_measures.batch_mask_gradient(net, s.task, inputs[i:i + PROBE_CHUNK],
                                                      answers[i:i + PROBE_CHUNK], s.variant, mask)
        alive = mask > 0
        share = grad / grad[alive].sum().clamp_min(1e-20)
        recent[:] = recent[-(patience - 1):] + [share] if patience > 1 else [share]
        if len(recent) < patience:
            return
        idle = alive & (torch.stack(recent).mean(0) < threshold / int(alive.sum()))
        for layer, head in idle.nonzero().tolist():
            if mask[layer].sum() > 1:   # the last head of a layer stays
                mask[layer, head] = 0
                pruned[names.head_name(layer, head)] = step
        if idle.any():
            recent.clear()   # shares among the heads left on from here

    return _run("pruning", s, Hooks(head_mask=mask, after=after), progress, should_stop, pruned=pruned)


class SharedKeys(nn.Module):
    """A fused QKV weight (or bias) kept as [Q rows; ONE head's K rows; V rows]: every head reads
    the same keys. `right_inverse` keeps head 0's initial key rows."""

    def __init__(self, n_heads: int, d_head: int):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_head

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        h, dh = self.n_heads, self.d_head
        q, k, v = packed.split([h * dh, dh, h * dh], 0)
        return torch.cat([q, k.repeat(h, *[1] * (k.dim() - 1)), v], 0)

    def right_inverse(self, full: torch.Tensor) -> torch.Tensor:
        q, k, v = full.split(self.n_heads * self.d_head, 0)
        return torch.cat([q, k[: self.d_head], v], 0)


def share_keys(net) -> None:
    """Tie every layer's key projection across its heads (in place, before the optimizer)."""
    for block in net.blocks:
        attn = block.attn
        if attn.n_kv != attn.n_heads:
            raise ValueError("sharing keys needs one K/V head per query head to start from")
        for name in ("weight", "bias"):
            if getattr(attn.qkv, name, None) is not None:
                parametrize.register_parametrization(attn.qkv, name, SharedKeys(attn.n_heads, attn.d_head))


def unshare_keys(net) -> None:
    """Back to plain weights holding the shared values (the trained toy is an ordinary model)."""
    for block in net.blocks:
        for name in ("weight", "bias"):
            if parametrize.is_parametrized(block.attn.qkv, name):
                parametrize.remove_parametrizations(block.attn.qkv, name, leave_parametrized=True)


def trainable_params(net) -> int:
    return sum(p.numel() for p in net.parameters() if p.requires_grad)


def shared_keys(s: TrainSettings, progress=None, should_stop=None) -> ExperimentResult:
    counted: list[int] = []

    def prepare(net):
        share_keys(net)
        counted.append(trainable_params(net))

    result = _run("shared_k", s, Hooks(prepare=prepare, finish=unshare_keys), progress, should_stop)
    result.params = counted[0]   # what was trained (the unshared model stores the copies again)
    return result


RUNNERS: dict[str, Callable[..., ExperimentResult]] = {
    "baseline": baseline, "dropout": dropout,
    "temp:0.5": lambda s, progress=None, should_stop=None: temperature(s, progress, should_stop, 0.5),
    "temp:2": lambda s, progress=None, should_stop=None: temperature(s, progress, should_stop, 2.0),
    "variance": variance_regulariser, "pruning": dynamic_pruning, "shared_k": shared_keys,
}


def run(name: str, steps: int = SETTINGS.steps, seed: int = 0, progress=None, should_stop=None) -> ExperimentResult:
    """One experiment by its key in EXPERIMENTS."""
    if name not in RUNNERS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}")
    return RUNNERS[name](settings_for(steps, seed), progress=progress, should_stop=should_stop)


# ---------------------------------------------------------------- sentences from the numbers
def effect_words(change: float) -> str:
    if abs(change) < NO_EFFECT:
        return "no measurable effect"
    return "it helped" if change > 0 else "it did not help"


def verdict(result: ExperimentResult, base: ExperimentResult) -> str:
    """What the experiment did to exact accuracy against the baseline at the same seed and steps,
    in words chosen by the measured numbers."""
    if (result.seed, result.steps) != (base.seed, base.steps):
        raise ValueError("compare an experiment with the baseline of the same seed and steps")
    change = result.exact - base.exact
    text = (f"{result.label}: exact held-out accuracy {result.exact:.1%} against the baseline's "
            f"{base.exact:.1%} (seed {result.seed}, {result.steps} steps), {100 * change:+.1f} points — "
            f"{effect_words(change)}.")
    if result.name == "variance" and result.penalties:
        share = result.penalties[-1] / max(result.losses[-1] + result.penalties[-1], 1e-20)
        text += (f" The added term was {result.penalties[-1]:.2e} at the last step ({share:.2%} of the "
                 "loss).")
    if result.name == "pruning":
        off = ", ".join(f"{h} at step {step}" for h, step in result.pruned.items())
        heads = result.concentration.gradient.numel()
        text += (f" {len(result.pruned)} of {heads} heads went off as they went idle" +
                 (f": {off}." if off else "."))
    if result.name == "shared_k":
        text += (f" Shared keys train {result.params:,} parameters instead of {base.params:,} "
                 f"({result.params / base.params - 1:+.1%}).")
    if result.stopped_early or base.stopped_early:
        text += (f" Stopped early (time budget or cancel): {result.steps_done} and {base.steps_done} steps were "
                 "run, so this compares shorter trainings.")
    return text
