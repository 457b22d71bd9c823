"""Measuring one forward pass here: its latency at a sequence length (the one timer,
`attnviz.base.timing`), its peak memory, the machine it ran on, and the models a sweep times.

Timing: `time.perf_counter` (wall) by default, or this process's CPU time (`clock="cpu"`), which
on a shared machine ignores time other programs take, and equals latency only with one thread.
Memory: the peak of torch's CPU allocations during one extra forward pass, read from the
profiler's memory events (tracemalloc does not see torch; RSS hides freed-and-reused pages):
activations and workspace only; the weights are reported by `costmodel.weights_mb`.

Threads: torch's thread count is process-wide. Nothing here changes it except `thread_count`,
which only a process of its own (the CLI, a script) may use; `measure_point` refuses a thread
count other than this process's (a shared server measures those in a child process).
"""
from __future__ import annotations

import json
import math
import os
import platform
import tempfile
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Callable

import torch

from attnviz.base.timing import Timing, measure
from attnviz.core.attention import Variant, attend, parse_variant
from attnviz.latency import costmodel
from attnviz.latency.results import parse_synthetic
from attnviz.weights.catalogue import load_model, random_model


def machine_metadata() -> dict:
    cpu = ""
    for path, key in (("/proc/device-tree/model", None), ("/proc/cpuinfo", "model name")):
        try:
            text = open(path, errors="replace").read().strip("\x00\n ")
        except OSError:
            continue
        if key is None:
            cpu = text  # e.g. "Raspberry Pi 4 Model B Rev 1.4"
        else:
            cpu = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith(key)), "")
        if cpu:
            break
    return dict(cpu=cpu or platform.processor() or platform.machine(), cores=os.cpu_count() or 1,
                arch=platform.machine(), torch=torch.__version__, python=platform.python_version())


def threads_now() -> int:
    """torch's thread count in this process (what in-process measurements run at)."""
    return torch.get_num_threads()


@contextmanager
def thread_count(threads: int | None):
    """torch.set_num_threads for the block, restored afterwards. Process-wide: only for a process of
    its own (the CLI, a script); a shared server measures other thread counts in a child process."""
    old = torch.get_num_threads()
    change = bool(threads) and int(threads) != old
    if change:
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        if change:
            torch.set_num_threads(old)


def check_threads(threads: int | None):
    """A measurement at `threads` threads must run at this process's thread count: nothing here
    changes it (wrap in `thread_count` in a process of your own)."""
    if threads and int(threads) != torch.get_num_threads():
        raise ValueError(f"this process runs torch on {torch.get_num_threads()} thread(s), not {threads}: "
                         "measure other thread counts with `python -m attnviz.bench --threads N` (run_sweep "
                         "does that in a child process)")


@contextmanager
def native_stderr_silenced():
    """The profiler's C++ side prints start/stop lines on fd 2; the CLI keeps its progress bar clean."""
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def peak_memory_mb(fn, *, quiet: bool = False) -> float:
    """Peak MB that torch allocates on the CPU while fn runs, above what was allocated before."""
    from torch.profiler import ProfilerActivity, profile  # loaded only when memory is measured
    with tempfile.TemporaryDirectory() as tmp:
        with (native_stderr_silenced() if quiet else nullcontext()), torch.inference_mode():
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                fn()
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    totals = [e["args"].get("Total Allocated", 0) for e in events if e.get("name") == "[memory]"]
    return max([0, *totals]) / 2**20


def memory_budget_mb() -> float:
    """Half of the memory available now."""
    import psutil  # always installed: accelerate (requirements.txt) depends on it
    return psutil.virtual_memory().available / 2**20 / 2


# ---------------------------------------------------------------- models and shapes
def load(spec: str):
    """A bundled key, a local folder, or a synthetic spec (random weights: timing only)."""
    if spec.strip().startswith("synthetic:"):
        cfg = parse_synthetic(spec)
        if costmodel.weights_mb(cfg) > memory_budget_mb():
            raise ValueError(f"{spec} needs {costmodel.weights_mb(cfg):,.0f} MB of weights, more than half the "
                             "memory available; choose fewer layers or a smaller d")
        return random_model(cfg, key=spec.strip())
    return load_model(spec)


def grid_side(cfg, n: int) -> int:
    """Patches per side of the square image nearest to n tokens (class token and registers included)."""
    return max(1, round(math.sqrt(max(n - cfg.n_prefix, 1))))


def token_count(cfg, n: int) -> int:
    """The tokens a forward pass on n runs: n, or for a vision model its nearest square grid."""
    return cfg.n_prefix + grid_side(cfg, n) ** 2 if cfg.is_vision else n


def model_inputs(model, n: int) -> tuple[dict, int]:
    """Forward kwargs for n tokens (vision: the nearest square grid) and the real token count."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(n)
    if cfg.is_vision:
        side = grid_side(cfg, n)
        px = torch.randn(1, cfg.n_channels, side * cfg.patch_size, side * cfg.patch_size, generator=g)
        return dict(pixel_values=px), token_count(cfg, n)
    return dict(input_ids=torch.randint(0, cfg.vocab_size, (1, n), generator=g)), n


# ---------------------------------------------------------------- one point
@dataclass
class Point:
    tokens: int          # what ran: vision models round n to a square grid of patches
    timing: Timing
    peak_mem_mb: float   # NaN when memory was not measured


def measure_point(model, n: int, variant: Variant, *, warmup: int = 1, repeats: int = 5,
                  threads: int | None = None, clock: str = "wall", memory: bool = True, quiet: bool = False,
                  check: Callable[[], None] | None = None) -> Point:
    """Latency (median, p10, p90 of `repeats` runs after `warmup`) of one forward pass of `model` on
    n tokens with this attention variant, and (with `memory`) its peak memory from one more pass.
    `threads` (if given) must be this process's thread count; `check` (e.g. `Deadline.check`) runs
    before every run and raises to stop."""
    check_threads(threads)
    inputs, tokens = model_inputs(model, n)

    def run():
        return model.net(**inputs, variants=variant, logits=True)
    with torch.inference_mode():
        timing = measure(run, repeats, warmup, clock=clock, check=check)
    mem = float("nan")
    if memory:
        if check is not None:
            check()
        mem = peak_memory_mb(run, quiet=quiet)
    return Point(tokens, timing, mem)


def measure_attention(cfg, n: int, variant: Variant, *, repeats: int = 5, warmup: int = 1, clock: str = "wall",
                      check: Callable[[], None] | None = None) -> Timing:
    """One layer's attention alone (QK^T, softmax, weights x V: `core.attention.attend`) on n tokens
    with cfg's heads: the part of a forward pass whose cost is plainly n^2."""
    variant = parse_variant(variant)
    g = torch.Generator().manual_seed(n)
    q = torch.randn(1, cfg.n_heads, n, cfg.d_head, generator=g)
    k, v = (torch.randn(1, cfg.n_heads, n, cfg.d_head, generator=g) for _ in range(2))
    with torch.inference_mode():
        return measure(lambda: attend(q, k, v, causal=cfg.causal, variant=variant), repeats, warmup, clock=clock,
                       check=check)
