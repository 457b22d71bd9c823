"""A toy ViT trained here in the Lab: 2-D sinusoidal positions beside learned ones, and axial
attention (a block that attends along rows, then one along columns) beside full attention.

The images are drawn with numpy (seeded: the same seed gives the same pixels everywhere): noise
with two small bright marks, each inside one PATCH x PATCH patch of a GRID x GRID grid. The class
says where the marks lie relative to each other: in the same row, in the same column, or neither.
What a patch holds says nothing about the class (every patch is noise or a mark); only WHERE the
two marks are does, so the model has to use positions: its position table, and under axial
attention the row and column masks themselves.

The network is the project's own: a patch embedding, a position table, the core self-attention
`Block`s run by the one block runner (`attnviz.core.blocks.iter_layers`), max pooling over the
patches and a linear classifier. Max, because the class rests on two patches of 64: a mean over
the patches washed their evidence out (with learned positions, full and axial attention both
stayed at chance for 600 steps). Axial attention is the runner's `allowed` mask: block 2i sees
only its row, block 2i + 1 only its column. The mask keeps the n x n scores (the masked ones are
-inf), so here axial attention costs the wall time of full attention; `attention_flops` counts
what real axial attention, which scores only the keys along a row or a column, would compute.

Training runs through the toy trainings' one loop (`attnviz.toys.training.run_steps`) on one
thread of its own; with a seed, weights, losses and held-out counts are the same on every run.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from attnviz.base.limits import LIMITS
from attnviz.core.blocks import Block, iter_layers
from attnviz.core.config import Config
from attnviz.core.positional import sinusoidal_2d
from attnviz.toys.training import one_thread_here, optimiser_step, optimizer, run_steps

IMAGE, PATCH, MARK = 32, 4, 3             # 32 x 32 pixels, 4 x 4 patches, 3 x 3 marks
GRID = IMAGE // PATCH                     # 8 x 8 = 64 patches
N_PATCHES = GRID * GRID
NOISE = 0.3                               # standard deviation of the background
CLASSES = ("same row", "same column", "neither")
SAME_ROW, SAME_COLUMN, NEITHER = range(3)
POSITIONS = ("learned", "sinusoidal 2-D")
ATTENTIONS = ("full", "axial")
CONFIGURATIONS = tuple((p, a) for p in POSITIONS for a in ATTENTIONS)
HELD_OUT, HELD_OUT_SEED = 400, 20_000     # the held-out images: one fixed draw, never trained on


@dataclass(frozen=True)
class Images:
    pixels: np.ndarray        # (n, IMAGE, IMAGE) float32
    labels: np.ndarray        # (n,) class indices into CLASSES
    marks: np.ndarray         # (n, 2, 2): each mark's patch (row, column)


def draw(n: int, rng: np.random.Generator) -> Images:
    """`n` images, their classes drawn uniformly; the marks never share a patch."""
    if n < 1:
        raise ValueError(f"draw at least one image; got {n}")
    labels = rng.integers(0, len(CLASSES), n)
    r1, c1 = rng.integers(0, GRID, n), rng.integers(0, GRID, n)
    dr, dc = rng.integers(1, GRID, n), rng.integers(1, GRID, n)   # a nonzero shift: another row / column
    r2 = np.where(labels == SAME_ROW, r1, (r1 + dr) % GRID)
    c2 = np.where(labels == SAME_COLUMN, c1, (c1 + dc) % GRID)
    marks = np.stack([np.stack([r1, c1], -1), np.stack([r2, c2], -1)], 1)
    pixels = rng.normal(0.0, NOISE, (n, IMAGE, IMAGE)).astype(np.float32)
    offsets = rng.integers(0, PATCH - MARK + 1, (n, 2, 2))          # where in its patch a mark sits
    for i in range(n):
        for (r, c), (dy, dx) in zip(marks[i], offsets[i]):
            y, x = r * PATCH + dy, c * PATCH + dx
            pixels[i, y:y + MARK, x:x + MARK] += 1.0
    return Images(pixels, labels, marks)


def held_out_set(n: int = HELD_OUT) -> Images:
    """The held-out images: always the same draw (its own seed, apart from every training seed's)."""
    return draw(n, np.random.default_rng([HELD_OUT_SEED, n]))


def patches(pixels) -> torch.Tensor:
    """(B, IMAGE, IMAGE) -> (B, N_PATCHES, PATCH * PATCH), patches row by row (p = row * GRID + column)."""
    x = torch.as_tensor(pixels, dtype=torch.float32)
    B = x.shape[0]
    x = x.reshape(B, GRID, PATCH, GRID, PATCH).permute(0, 1, 3, 2, 4)
    return x.reshape(B, N_PATCHES, PATCH * PATCH)


def axial_masks(rows: int = GRID, cols: int = GRID) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, n) bool masks of a rows x cols grid, True where query patch i may see key patch j:
    the same row, and the same column."""
    p = torch.arange(rows * cols)
    r, c = p // cols, p % cols
    return r[:, None] == r[None, :], c[:, None] == c[None, :]


def attention_flops(attention: str, n_layers: int, d_model: int, rows: int = GRID, cols: int = GRID) -> int:
    """FLOPs of attention itself per image (scores q k^T and the weighted sum of values, a
    multiply-add counted as 2), summed over the layers: full attention scores n keys per query
    (4 n^2 d a layer); real axial attention scores only its row's c keys, or its column's r (a
    row and a column block: 4 n (r + c) d, against full's 2 x 4 n^2 d)."""
    check_choice("attention", attention, ATTENTIONS)
    n = rows * cols
    keys = [n] * n_layers if attention == "full" else [cols if i % 2 == 0 else rows for i in range(n_layers)]
    return sum(4 * n * k * d_model for k in keys)


def check_choice(what: str, value: str, known: tuple[str, ...]) -> None:
    if value not in known:
        raise ValueError(f"{what} must be one of {', '.join(known)}; got {value!r:.40}")


@dataclass(frozen=True)
class VitSettings:
    positions: str = "learned"
    attention: str = "full"
    steps: int = 150
    batch_size: int = 64
    lr: float = 1e-2
    seed: int = 0
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2          # axial: a row block then a column block, so an even number
    budget_s: float = field(default_factory=lambda: LIMITS.max_train_seconds)

    def check(self) -> None:
        """Raise ValueError, saying what to change, for settings that cannot work."""
        check_choice("positions", self.positions, POSITIONS)
        check_choice("attention", self.attention, ATTENTIONS)
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch size must be at least 1")
        if not 0 < self.lr <= 0.1:
            raise ValueError("learning rate must lie in (0, 0.1]")
        if not 1 <= self.n_layers <= 8:
            raise ValueError("the toy ViT has 1 to 8 layers")
        if self.attention == "axial" and self.n_layers % 2:
            raise ValueError("axial attention pairs a row block with a column block: use an even number of layers")
        if self.n_heads < 1 or self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of the number of heads ({self.n_heads})")
        if self.d_model % 4:
            raise ValueError(f"d_model must be a multiple of 4 (2-D sinusoidal positions); got {self.d_model}")
        if self.budget_s > LIMITS.max_train_seconds:
            raise ValueError(f"the lab trains for at most {LIMITS.max_train_seconds:.0f} s")

    def config(self) -> Config:
        self.check()
        return Config(family="toy-vit", task="encoder", n_layers=self.n_layers, n_heads=self.n_heads,
                      n_kv_heads=self.n_heads, d_model=self.d_model, d_head=self.d_model // self.n_heads,
                      d_ff=2 * self.d_model, max_positions=N_PATCHES, norm_eps=1e-5, positional="none",
                      pre_norm=True)

    @property
    def label(self) -> str:
        return f"{self.positions}, {self.attention}"


class ToyViT(nn.Module):
    """Patch embedding + positions, the core `Block`s (masked along rows / columns when axial),
    max pooling over the patches, a linear classifier."""

    def __init__(self, s: VitSettings):
        super().__init__()
        cfg = s.config()
        self.settings, self.cfg = s, cfg
        d = cfg.d_model
        self.embed = nn.Linear(PATCH * PATCH, d)
        if s.positions == "learned":
            self.pos = nn.Parameter(torch.randn(N_PATCHES, d) * 0.5)
        else:  # fixed, not trained
            self.register_buffer("pos", sinusoidal_2d(GRID, GRID, d), persistent=False)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.head = nn.Linear(d, len(CLASSES))
        row, col = axial_masks()
        self.register_buffer("row_mask", row, persistent=False)
        self.register_buffer("col_mask", col, persistent=False)

    def mask(self, layer: int) -> torch.Tensor | None:
        """The `allowed` mask of a layer: None (full), its row, or its column."""
        if self.settings.attention == "full":
            return None
        return self.row_mask if layer % 2 == 0 else self.col_mask

    def forward(self, x: torch.Tensor, need_weights: bool = False, check: Callable[[], None] | None = None):
        """x (B, N_PATCHES, PATCH * PATCH) -> (logits (B, classes), {layer: weights (B, h, n, n)}
        when `need_weights`). `check()` runs before every block (a deadline or a cancel)."""
        if x.dim() != 3 or tuple(x.shape[1:]) != (N_PATCHES, PATCH * PATCH):
            raise ValueError(f"the toy ViT reads [B, {N_PATCHES}, {PATCH * PATCH}] patches; got {list(x.shape)}")
        h, weights = self.embed(x) + self.pos, {}
        for layer in range(len(self.blocks)):  # one block at a time: each layer has its own mask
            for step in iter_layers(self.blocks, h, layer, layer + 1, capture={layer} if need_weights else (),
                                    check=check, allowed=self.mask(layer)):
                h = step.out
                if step.weights is not None:
                    weights[layer] = step.weights
        return self.head(self.norm(h).amax(1)), weights


def new_vit(s: VitSettings) -> ToyViT:
    torch.manual_seed(s.seed)
    return ToyViT(s)


@dataclass
class VitResult:
    net: ToyViT
    settings: VitSettings
    losses: list[float]
    seconds: float
    steps_done: int
    stopped_early: bool          # the time budget ran out, or the job was told to stop
    correct: int                 # held-out images classified right
    total: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total

    @property
    def flops(self) -> int:
        s = self.settings
        return attention_flops(s.attention, s.n_layers, s.d_model)

    @property
    def computed_flops(self) -> int:
        """What this Lab computes: the mask keeps the n x n scores, so full attention's count."""
        return attention_flops("full", self.settings.n_layers, self.settings.d_model)


def count_correct(net: ToyViT, images: Images | None = None) -> tuple[int, int]:
    """(correct, total) of the net's classes on `images` (default: the held-out set)."""
    images = held_out_set() if images is None else images
    with torch.inference_mode():
        logits, _ = net(patches(images.pixels))
    return int((logits.argmax(-1).numpy() == images.labels).sum()), len(images.labels)


def train(s: VitSettings, progress: Callable[[int, int, float], None] | None = None,
          should_stop: Callable[[], bool] | None = None, check: Callable[[], None] | None = None,
          stop_at_budget: bool = True) -> VitResult:
    """Train a fresh toy ViT on freshly drawn batches: `progress(step, steps, loss)` after each
    step; stops at `s.budget_s` (unless `stop_at_budget` is False) or before a step at which
    `should_stop()` is true; `check()` runs before every block and raises to abort. Scored on the
    held-out images. Deterministic for a seed when it runs to the end."""
    s.check()
    with one_thread_here():
        net = new_vit(s).train()
        opt, rng = optimizer(net), np.random.default_rng(s.seed)

        def one_step() -> float:
            images = draw(s.batch_size, rng)
            logits, _ = net(patches(images.pixels), check=check)
            return optimiser_step(net, opt, F.cross_entropy(logits, torch.from_numpy(images.labels)))

        losses, seconds, stopped = run_steps(opt, s, one_step, progress, stop_at_budget, should_stop)
        net.eval()
        correct, total = count_correct(net)
    return VitResult(net, s, losses, seconds, len(losses), stopped, correct, total)


def patch_maps(net: ToyViT, pixels: np.ndarray, patch: int) -> list[np.ndarray]:
    """What patch `patch` attends to in each layer (the heads' mean), as GRID x GRID maps over one
    image (IMAGE, IMAGE); each map sums to 1."""
    if not 0 <= patch < N_PATCHES:
        raise ValueError(f"patch must lie in 0..{N_PATCHES - 1}; got {patch}")
    with torch.inference_mode():
        _, weights = net(patches(pixels[None]), need_weights=True)
    return [weights[layer][0, :, patch].mean(0).reshape(GRID, GRID).numpy() for layer in sorted(weights)]


# ---------------------------------------------------------------- what the numbers say
def difference_words(better: VitResult, base: VitResult) -> str:
    """"helped" / "did not help" / "made no clear difference", read from two held-out counts: a
    difference within two standard errors of the difference of two proportions is not clear."""
    p, q = better.accuracy, base.accuracy
    se = (p * (1 - p) / better.total + q * (1 - q) / base.total) ** 0.5
    points = 100 * (p - q)
    if abs(p - q) <= 2 * se:
        return f"made no clear difference ({points:+.2f} points, within two standard errors)"
    return f"helped ({points:+.2f} points)" if p > q else f"did not help ({points:+.2f} points)"


def at_chance(r: VitResult) -> bool:
    """Whether a run's held-out accuracy is within two standard errors of guessing: it has not
    learned yet, and a difference against it says nothing about what it would learn."""
    chance = 1 / len(CLASSES)
    return abs(r.accuracy - chance) <= 2 * (chance * (1 - chance) / r.total) ** 0.5


def percent(r: VitResult) -> str:
    return f"{100 * r.accuracy:.2f} % ({r.correct}/{r.total})"


def summary(results: list[VitResult]) -> str:
    """The sentence the view shows under the figures, built from the measured counts only."""
    if not results:
        return "Nothing trained yet."
    by = {(r.settings.positions, r.settings.attention): r for r in results}
    parts = []
    for positions in POSITIONS:
        full, axial = by.get((positions, "full")), by.get((positions, "axial"))
        if full and axial:
            ratio = full.flops / axial.flops
            idle = [r for r in (full, axial) if at_chance(r)]
            if idle:
                said = " and ".join(f"{r.settings.attention} attention ({percent(r)})" for r in idle)
                parts.append(f"With {positions} positions, {said} {'has' if len(idle) == 1 else 'have'} not learned "
                             f"yet after {idle[0].steps_done} steps (at chance): train longer before comparing "
                             f"full and axial attention.")
                continue
            parts.append(f"With {positions} positions, axial attention reached {percent(axial)} against full "
                         f"attention's {percent(full)}: it {difference_words(axial, full)}, with {ratio:.0f}× "
                         "fewer attention FLOPs counted for real axial attention.")
    for attention in ATTENTIONS:
        learned, sine = by.get((POSITIONS[0], attention)), by.get((POSITIONS[1], attention))
        if learned and sine and not (at_chance(learned) and at_chance(sine)):
            parts.append(f"With {attention} attention, 2-D sinusoidal positions ({percent(sine)}) beside learned "
                         f"ones ({percent(learned)}) {difference_words(sine, learned)}.")
    if not parts:
        parts = [f"{r.settings.label}: {percent(r)} of the held-out images right." for r in results]
    chance = 100 / len(CLASSES)
    return " ".join(parts) + f" Chance is {chance:.1f} % ({len(CLASSES)} classes, drawn uniformly)."
