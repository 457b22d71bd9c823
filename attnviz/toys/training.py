"""Training toy transformers within a time budget, with optional gradient checkpointing and a
measured peak of training memory.

Gradient checkpointing wraps each block from outside (`checkpointed`) so `Transformer.forward`
stays the one forward pass; the network is private to the training run, never a shared model.
Training-time experiments change the one loop through `Hooks` (a head mask, a term added to the
loss, a change to the fresh network, a call after each step), never through a loop of their own.
Peak memory is measured, not estimated: `TensorMeter` watches every tensor storage created
during one training step and when it is freed (CPU has no allocator statistics to ask).
"""
from __future__ import annotations

import ctypes
import functools
import math
import os
import re
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import checkpoint

from attnviz.core.attention import parse_variant
from attnviz.core.transformer import Transformer
from attnviz.base.limits import LIMITS
from attnviz.base.timing import measure
from attnviz.toys.tasks import Score, Task, ToyModel, evaluate, score, toy_config

# Training runs on one OpenMP thread of its own calling thread (`one_thread_here`); torch's
# process-wide thread count is never changed.
# Cost model of one training step, fitted to the CPU time of single-threaded steps measured on
# this 2-core machine (CPU time, because wall time on a shared machine is noise): a fixed cost
# per step and per layer (PyTorch's per-op overhead dominates tiny models) plus arithmetic at
# 45 GFLOP/s. One thread's CPU time bounds the wall time of two idle cores from above.
STEP_BASE_S, STEP_LAYER_S, FLOPS_PER_S, CHECKPOINT_FACTOR = 0.006, 0.006, 4.5e10, 1.35


@dataclass(frozen=True)
class TrainSettings:
    task: Task = Task()
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 64
    positional: str = "learned"
    variant: str = "softmax"
    steps: int = 600
    batch_size: int = 64
    lr: float = 3e-3
    seed: int = 0
    checkpoint: bool = False    # gradient checkpointing over blocks
    # training stops here even if the estimate was optimistic; LIMITS.max_train_seconds is the lab's
    # promise: any accepted setting trains in under a minute on two cores
    budget_s: float = field(default_factory=lambda: LIMITS.max_train_seconds)

    def config(self):
        return toy_config(self.task, self.n_layers, self.n_heads, self.d_model, self.positional)


@dataclass
class TrainResult:
    model: ToyModel
    settings: TrainSettings
    losses: list[float]
    seconds: float
    steps_done: int
    stopped_early: bool      # the time budget ran out before `steps`
    score: Score
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, exact) checkpoints


@dataclass
class Hooks:
    """What a training-time experiment changes in `train` (all optional)."""
    head_mask: torch.Tensor | None = None   # [L, H] used in every step and evaluation; `after` may zero heads
    penalty: Callable[[dict], torch.Tensor] | None = None   # {layer: weights (B, h, T, T)} -> added to the loss
    prepare: Callable[[Transformer], None] | None = None    # the fresh network, before its optimizer exists
    after: Callable[[int, Transformer], None] | None = None  # after each step (its number), before evaluation
    finish: Callable[[Transformer], None] | None = None     # after the last step, before the model is wrapped


def estimate_seconds(s: TrainSettings) -> float:
    """Expected training time on two cores (rounded up; see the constants above)."""
    cfg = s.config()
    T, d, L = s.task.seq_len, cfg.d_model, cfg.n_layers
    params = L * (4 * d * d + 2 * d * cfg.d_ff) + d * cfg.vocab_size
    flops = 6 * s.batch_size * T * params + 12 * s.batch_size * L * T * T * d  # forward + backward
    per_step = STEP_BASE_S + STEP_LAYER_S * L + flops / FLOPS_PER_S
    return s.steps * per_step * (CHECKPOINT_FACTOR if s.checkpoint else 1.0)


def _step(net, opt, s: TrainSettings, variant, generator, hooks: Hooks | None = None) -> float:
    """One optimiser step on a fresh batch (what `train` runs and `timed_estimate` times); its loss."""
    inputs, answers, _ = s.task.sample(s.batch_size, generator)
    return optimiser_step(net, opt, _loss(net, s.task, inputs, answers, variant, s.checkpoint, hooks=hooks))


def optimiser_step(net, opt, loss: torch.Tensor) -> float:
    """THE optimiser step of every toy training (toy transformers, the image reader): gradients of
    `loss`, clipped to norm 1, one step of `opt`; the loss as a float."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    return loss.item()


def timed_estimate(s: TrainSettings, eval_every: int = 0, steps: int = 3) -> float:
    """Seconds a training of these settings should take HERE: a few training steps of a throwaway
    copy (the same code as `train`, after one untimed step) and one held-out evaluation timed with
    the one timer, scaled to `s.steps` and its evaluations. The formula of `estimate_seconds`
    guesses for an idle two-core machine, and a busy one took 3-20x longer."""
    torch.manual_seed(s.seed)
    with one_thread_here():
        net = Transformer(s.config()).train()
        variant, opt = parse_variant(s.variant), optimizer(net)
        generator = torch.Generator().manual_seed(s.seed)

        per_step = measure(lambda: _step(net, opt, s, variant, generator), steps, 1).median
        evals = s.steps // eval_every if eval_every else 0
        per_eval = 0.0
        if evals:
            net.eval()
            per_eval = measure(lambda: score(net, s.task, variant, n=500), 1, 0).median
    return s.steps * per_step + evals * per_eval


def check_settings(s: TrainSettings) -> None:
    """Raise ValueError, saying what to change, for settings that cannot work or fit the budget."""
    s.config()  # shape errors
    parse_variant(s.variant)
    if s.steps < 1 or s.batch_size < 1:
        raise ValueError("steps and batch size must be at least 1")
    if not 0 < s.lr <= 0.1:
        raise ValueError("learning rate must lie in (0, 0.1]")
    if s.budget_s > LIMITS.max_train_seconds:
        raise ValueError(f"the lab trains for at most {LIMITS.max_train_seconds:.0f} s")
    est = estimate_seconds(s)
    if est > s.budget_s:
        fit = max(1, int(s.steps * s.budget_s / est))
        raise ValueError(f"these settings would take about {est:.0f} s to train, over the "
                         f"{s.budget_s:.0f} s budget on two cores: use at most {fit} steps, or fewer "
                         "layers, a smaller width or batch")


@functools.lru_cache(maxsize=1)
def _openmp():
    """The OpenMP runtime torch runs on (libgomp, libiomp5 or libomp, already loaded), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if line.count(" ") >= 5 and "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if re.match(r"lib(gomp|iomp5|omp)\b.*\.so", os.path.basename(path)):
            try:
                lib = ctypes.CDLL(path)  # the loaded library itself (dlopen of a loaded path)
                lib.omp_get_max_threads.restype = ctypes.c_int
                lib.omp_set_num_threads.argtypes = [ctypes.c_int]
                return lib
            except (OSError, AttributeError):
                continue
    return None


@contextmanager
def one_thread_here():
    """One OpenMP thread for the CALLING thread only, its previous count restored afterwards.

    Toy-sized ops gain nothing from a second thread, and on a busy machine OpenMP threads that
    wait for each other made a 60-step training take 62-86 s instead of 4-7 s (measured on this
    2-core machine). `torch.set_num_threads` would do it PROCESS-WIDE (every thread that starts
    meanwhile, other sessions' reruns included, would stay on one thread); OpenMP's own setting
    is per thread, so nothing else changes. Losses are bit-identical to a single-threaded run, so
    the shipped checkpoints stay reproducible. Where no OpenMP runtime is found it does nothing.
    """
    lib = _openmp()
    if lib is None:
        yield
        return
    torch.get_num_threads()  # torch's lazy per-thread init first, so it cannot undo ours later
    before = lib.omp_get_max_threads()
    lib.omp_set_num_threads(1)
    try:
        yield
    finally:
        lib.omp_set_num_threads(before)


@contextmanager
def checkpointed(net: Transformer):
    """Recompute each block's activations during backward instead of storing them."""
    for block in net.blocks:
        block.forward = (lambda x, _block=block, **kw:
                         checkpoint(type(_block).forward, _block, x, use_reentrant=False, **kw))
    try:
        yield net
    finally:
        for block in net.blocks:
            del block.forward  # back to the class's forward


def answer_loss(net: Transformer, task: Task, inputs, answers, variant, head_mask=None, need_weights=False,
                check=None):
    """Cross-entropy of the answer tokens (the one training loss), and the network's Output."""
    out = net(input_ids=inputs, variants=variant, check=check, head_mask=head_mask, need_weights=need_weights)
    logits = out.logits[:, task.answer_positions]                   # (B, A, vocab)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), answers.reshape(-1)), out


def _loss(net: Transformer, task: Task, inputs, answers, variant, use_checkpoint: bool, check=None,
          hooks: Hooks | None = None):
    hooks = hooks or Hooks()
    with checkpointed(net) if use_checkpoint else _nothing():
        loss, out = answer_loss(net, task, inputs, answers, variant, hooks.head_mask,
                                hooks.penalty is not None, check)
    return loss if hooks.penalty is None else loss + hooks.penalty(out.attentions)


def lr_at(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))


def optimizer(net):
    return torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.01)


def train(s: TrainSettings, progress: Callable[[int, int, float], None] | None = None,
          key: str = "trained toy", eval_every: int = 0, stop_at_budget: bool = True,
          should_stop: Callable[[], bool] | None = None, hooks: Hooks | None = None) -> TrainResult:
    """Train a fresh toy model; `progress(step, steps, loss)` after every step; every
    `eval_every` steps the exact accuracy on 500 held-out examples goes into `history`.
    Training stops when `s.budget_s` has passed (a busy machine) unless `stop_at_budget` is
    False, as when reproducing the shipped checkpoints, and before any step at which
    `should_stop()` (e.g. a `jobs.Cancel`: the user has gone) is true; `stopped_early` says so.
    `hooks`: a training-time experiment's changes (see `Hooks`)."""
    check_settings(s)
    with one_thread_here():
        return _train(s, progress, key, eval_every, stop_at_budget, should_stop, hooks or Hooks())


def run_steps(opt, s, one_step: Callable[[], float], progress, stop_at_budget: bool, should_stop=None,
              after: Callable[[int], None] | None = None):
    """The loop every toy training runs: `s.steps` optimiser steps at the warm-up / decay rate
    `lr_at`, stopping at `s.budget_s` (unless `stop_at_budget` is False) or before any step at which
    `should_stop()` is true; `after(step)` then `progress(step, steps, loss)` after each step.
    Returns (losses, seconds, stopped)."""
    losses, start, stopped = [], time.perf_counter(), False
    for step in range(s.steps):
        if (stop_at_budget and time.perf_counter() - start > s.budget_s) or (
                should_stop is not None and should_stop()):
            stopped = True
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s.steps, s.lr)
        losses.append(one_step())
        if after is not None:
            after(step + 1)
        if progress is not None:
            progress(step + 1, s.steps, losses[-1])
    return losses, time.perf_counter() - start, stopped


def _train(s: TrainSettings, progress, key: str, eval_every: int, stop_at_budget: bool,
           should_stop, hooks: Hooks) -> TrainResult:
    torch.manual_seed(s.seed)
    net = Transformer(s.config()).train()
    if hooks.prepare is not None:
        hooks.prepare(net)
    variant = parse_variant(s.variant)
    generator = torch.Generator().manual_seed(s.seed)
    opt, history = optimizer(net), []

    def evaluated(step: int):
        if hooks.after is not None:
            hooks.after(step, net)
        if eval_every and step % eval_every == 0:
            net.eval()
            history.append((step, score(net, s.task, variant, hooks.head_mask, n=500).exact))
            net.train()

    losses, seconds, stopped = run_steps(opt, s, lambda: _step(net, opt, s, variant, generator, hooks), progress,
                                         stop_at_budget, should_stop, evaluated)
    if hooks.finish is not None:
        hooks.finish(net)
    model = wrap(net, s, key)
    return TrainResult(model, s, losses, seconds, len(losses), stopped, evaluate(model, hooks.head_mask), history)


def wrap(net: Transformer, s: TrainSettings, key: str) -> ToyModel:
    info = ToyModel.describe(key, net.cfg, f"toy transformer trained on the {s.task.name} task in the lab", net)
    return ToyModel(net, info, s.task, s.variant)


# ---------------------------------------------------------------- memory
class TensorMeter(TorchDispatchMode):
    """Live bytes of CPU tensor storages created inside the `with` block, and their peak."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = self.peak = 0

    def _freed(self, key: int):
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key = id(storage)  # storages keep one Python object while alive
                if key not in self.live and storage.nbytes():
                    weakref.finalize(storage, self._freed, key)
                    self.live[key] = storage.nbytes()
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
        return out


@dataclass(frozen=True)
class MemoryReport:
    step_peak: int      # bytes: activations, gradients and temporaries at the worst moment of a step
    resident: int       # bytes: parameters + optimizer state, held all along
    checkpoint: bool

    @property
    def total(self) -> int:
        return self.step_peak + self.resident


def training_memory(s: TrainSettings, use_checkpoint: bool | None = None, check=None) -> MemoryReport:
    """Measure one training step of a fresh model of these settings (after a warm-up step that
    creates the optimizer state). `check()` (a Deadline's or Cancel's) runs before each step and
    each block of the forward passes, and raises to stop."""
    use_checkpoint = s.checkpoint if use_checkpoint is None else use_checkpoint
    torch.manual_seed(s.seed)
    net = Transformer(s.config()).train()
    variant, opt = parse_variant(s.variant), optimizer(net)
    generator = torch.Generator().manual_seed(s.seed)
    with one_thread_here():
        for measured in (False, True):
            if check is not None:
                check()
            inputs, answers, _ = s.task.sample(s.batch_size, generator)
            opt.zero_grad(set_to_none=True)
            meter = TensorMeter()
            with meter if measured else _nothing():
                _loss(net, s.task, inputs, answers, variant, use_checkpoint, check).backward()
                opt.step()
    resident = sum(p.numel() * p.element_size() for p in net.parameters())
    resident += sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
                    if isinstance(t, torch.Tensor))
    return MemoryReport(meter.peak, resident, use_checkpoint)


@contextmanager
def _nothing():
    yield


def latency(model: ToyModel, batch: int = 1, repeats: int = 30) -> float:
    """Median seconds of one forward pass over `batch` held-out examples."""
    inputs, _, _ = model.task.sample(batch, torch.Generator().manual_seed(0))
    with torch.inference_mode():  # three warm-up calls settle the allocator and kernels
        return measure(lambda: model.net(input_ids=inputs, variants=model.variant), repeats, warmup=3).median
