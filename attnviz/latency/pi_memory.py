"""Memory of modelled rows: nothing runs on this host, so a sweep of modelled rows only needs no
host memory and no built model (a stand-in with the shape alone); what matters is whether the model
would fit in a Raspberry Pi's RAM, in the dtype its engine runs."""
from __future__ import annotations

from dataclasses import dataclass

from attnviz.core.attention import parse_variant
from attnviz.core.config import Config
from attnviz.latency.costmodel import activation_mb, weights_mb
from attnviz.latency.engines import DTYPES
from attnviz.latency.results import with_heads

# RAM of the boards sold (GiB): Pi 4 B 1 / 2 / 4 / 8, Pi 5 2 / 4 / 8 / 16
PI_RAM_GB = {"pi4": (1, 2, 4, 8), "pi5": (2, 4, 8, 16)}
PI_NAMES = {"pi4": "Pi 4", "pi5": "Pi 5"}


@dataclass(frozen=True)
class Shape:
    """A model's shape without weights: all that modelled rows read (`cfg`, and `prune` to keep the
    first k heads of every layer, as the real model's prune does)."""
    cfg: Config

    def prune(self, keep) -> "Shape":
        return Shape(with_heads(self.cfg, int(keep[0].sum())))


def measures_here(plan) -> bool:
    """Whether the sweep times anything on this host (backend cpu); every other row is modelled."""
    return "cpu" in plan.backends


def models_for(plan, configs: dict[str, Config], loader) -> dict:
    """The models a sweep needs: built by `loader` when it measures here, else weightless shapes
    (a 5 GB synthetic model priced for a Pi is never allocated on this host)."""
    if measures_here(plan):
        return {key: loader(key) for key in plan.models}
    return {key: Shape(configs[key]) for key in plan.models}


def device_mb(cfg: Config, n: int, dtype: str, variant=None) -> float:
    """What one forward pass holds on the device (MiB): the weights in the engine's dtype and the
    activations of n tokens (as `activation_mb` counts them, fp32)."""
    return weights_mb(cfg) * DTYPES[dtype] / DTYPES["fp32"] + activation_mb(cfg, n, parse_variant(variant))


def fit_text(device: str, mb: float) -> str:
    """Which boards of this Pi hold `mb` MiB, in words."""
    boards, name = PI_RAM_GB[device], PI_NAMES[device]
    fits = [g for g in boards if mb <= g * 1024]
    if not fits:
        return (f"more than the largest {name}'s {boards[-1]} GB of RAM: it would not fit there "
                "(it would swap or be killed)")
    if fits[0] == boards[0]:
        return f"fits every {name} ({', '.join(map(str, boards))} GB)"
    smaller = [g for g in boards if g < fits[0]]
    return (f"fits a {name} with {fits[0]} GB of RAM or more; it would not fit the "
            f"{' / '.join(map(str, smaller))} GB boards")


def ram_notes(plan, configs: dict[str, Config]) -> list[tuple[bool, str]]:
    """(fits every board, what it says) per model x Pi backend x engine dtype of the plan: the
    largest of its modelled rows (longest sequence, all heads) against the Pi's RAM."""
    out = []
    for key in plan.models:
        cfg, n = configs[key], max(plan.seq_lens)
        for device in (b for b in plan.backends if b in PI_RAM_GB):
            for dtype in dict.fromkeys(d for _, d in plan.engine_pairs()):
                mb = max(device_mb(cfg, n, dtype, v) for v in plan.variants)
                text = fit_text(device, mb)
                out.append((text.startswith("fits every"),
                            f"{key} on a {PI_NAMES[device]} in {dtype}: about {mb:,.0f} MB at n={n}; {text}"))
    return out
