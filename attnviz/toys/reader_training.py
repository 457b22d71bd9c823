"""Training the Lab's image reader (`attnviz.toys.image_reader`) within the Lab's time budget,
with the toy trainings' one optimiser step (`attnviz.toys.training.optimiser_step`), a timed
estimate before it starts, a stop when its job is cancelled; and the reader trained here earlier,
shipped as safetensors + JSON (`python -m attnviz.toys.reader_training` retrains it).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from importlib.resources import files
from typing import Callable

import torch
import torch.nn.functional as F

from attnviz.base.limits import LIMITS
from attnviz.base.timing import measure
from attnviz.toys.image_reader import (Drawn, ImageReader, ReaderConfig, batch, exact_accuracy, new_reader,
                                       random_drawing, reader_config)
from attnviz.toys.training import one_thread_here, optimiser_step, optimizer, run_steps

KEY = "image-reader"
FOLDER = files("attnviz") / "data" / "toys" / "reader"


@dataclass(frozen=True)
class ReaderSettings:
    steps: int = 1500
    batch_size: int = 48
    lr: float = 5e-3
    seed: int = 0
    d_model: int = 32
    n_heads: int = 4
    enc_layers: int = 2
    dec_layers: int = 2
    budget_s: float = field(default_factory=lambda: LIMITS.max_train_seconds)

    def config(self) -> ReaderConfig:
        return reader_config(self.d_model, self.n_heads, self.enc_layers, self.dec_layers)

    def check(self) -> None:
        self.config()
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch size must be at least 1")
        if not 0 < self.lr <= 0.1:
            raise ValueError("learning rate must lie in (0, 0.1]")
        if self.budget_s > LIMITS.max_train_seconds:
            raise ValueError(f"the lab trains for at most {LIMITS.max_train_seconds:.0f} s")


@dataclass
class ReaderResult:
    net: ImageReader
    settings: ReaderSettings
    losses: list[float]
    seconds: float
    steps_done: int
    stopped_early: bool          # the time budget ran out, or the job was cancelled
    exact: float                 # exact-match accuracy on the held-out pictures (image_reader.held_out_set)


def _loss(net: ImageReader, drawings: list[Drawn]) -> torch.Tensor:
    pixels, feed, target = batch(drawings)
    memory, _ = net.encode(pixels)
    logits = net.step(feed, net.start(memory)).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)


def _step(net, opt, s: ReaderSettings, generator) -> float:
    """One optimiser step on freshly drawn pictures (what `train` runs and `timed_estimate` times)."""
    return optimiser_step(net, opt, _loss(net, [random_drawing(generator) for _ in range(s.batch_size)]))


def timed_estimate(s: ReaderSettings, steps: int = 3) -> float:
    """Seconds `s.steps` steps should take HERE: a few steps of a throwaway reader (after one
    untimed step), timed with the one timer, plus one held-out evaluation."""
    s.check()
    with one_thread_here():
        net = new_reader(s.config(), s.seed).train()
        opt, generator = optimizer(net), torch.Generator().manual_seed(s.seed)
        per_step = measure(lambda: _step(net, opt, s, generator), steps, 1).median
        net.eval()
        per_eval = measure(lambda: exact_accuracy(net), 1, 0).median
    return s.steps * per_step + per_eval


def train(s: ReaderSettings, progress: Callable[[int, int, float], None] | None = None,
          should_stop: Callable[[], bool] | None = None, stop_at_budget: bool = True) -> ReaderResult:
    """Train a fresh reader: `progress(step, steps, loss)` after every step; stops at `s.budget_s`
    (unless `stop_at_budget` is False) and before any step at which `should_stop()` (a
    `jobs.Cancel`) is true. Deterministic for a seed when it runs to the end."""
    s.check()
    with one_thread_here():
        net = new_reader(s.config(), s.seed).train()
        opt, generator = optimizer(net), torch.Generator().manual_seed(s.seed)
        losses, seconds, stopped = run_steps(opt, s, lambda: _step(net, opt, s, generator), progress,
                                             stop_at_budget, should_stop)
        net.eval()
        exact = exact_accuracy(net)
    return ReaderResult(net, s, losses, seconds, len(losses), stopped, exact)


def save(res: ReaderResult, folder=None) -> None:
    from safetensors.torch import save_file
    folder = folder or FOLDER
    state = {k: v.contiguous() for k, v in res.net.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(state, str(folder / f"{KEY}.safetensors"))
    meta = dict(key=KEY, settings={k: v for k, v in asdict(res.settings).items() if k != "budget_s"},
                config=asdict(res.net.cfg), seconds=round(res.seconds, 1), steps_done=res.steps_done,
                exact=res.exact, final_loss=res.losses[-1] if res.losses else None,
                description="trained here by python -m attnviz.toys.reader_training; not a pretrained model")
    (folder / f"{KEY}.json").write_text(json.dumps(meta, indent=1))


def load() -> ReaderResult:
    """The reader trained here earlier (shipped safetensors; never unpickled) and what was measured."""
    from safetensors.torch import load as load_bytes
    meta = json.loads((FOLDER / f"{KEY}.json").read_text())
    state = load_bytes((FOLDER / f"{KEY}.safetensors").read_bytes())
    net = ImageReader.from_state(ReaderConfig(**meta["config"]), state)
    return ReaderResult(net.eval(), ReaderSettings(**meta["settings"]), [], meta["seconds"], meta["steps_done"],
                        False, meta["exact"])


def main():
    """`python -m attnviz.toys.reader_training`: train to the end (no time budget), score, ship."""
    res = train(ReaderSettings(steps=2000), stop_at_budget=False)
    save(res)
    return res


if __name__ == "__main__":
    main()
