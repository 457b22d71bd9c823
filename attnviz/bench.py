"""Latency and memory versus sequence length: timing, sweeps, budgets, the CSV the CLI writes and
the page imports, machine metadata. The cost model lives in `costmodel`; the CLI is `main`.

Timing: `time.perf_counter` (wall) by default, or this process's CPU time (`clock="cpu"`), which
on a shared machine ignores time other programs take, and equals latency only with one thread.
Memory: the peak of torch's CPU allocations during one extra forward pass, read from the
profiler's memory events (tracemalloc does not see torch; RSS hides freed-and-reused pages):
activations and workspace only; the weights are reported by `costmodel.weights_mb`.
"""
from __future__ import annotations

import functools
import json
import math
import os
import platform
import re
import statistics
import tempfile
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pandas as pd
import torch

from . import costmodel as cm
from .attention import SOFTMAX, Variant, parse_variant
from .config import Config
from .results import COLUMNS, SCHEMA, config_spec, parse_synthetic, read_results, to_csv, with_heads  # noqa: F401

BACKENDS = ("cpu", "cpu-model", "pi4", "pi5")  # cpu is measured here; the others are the cost model


# ---------------------------------------------------------------- machine and timing
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


@contextmanager
def thread_count(threads: int | None):
    """torch.set_num_threads for the block, restored afterwards."""
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(old)


@dataclass
class Timing:
    median_ms: float
    p10_ms: float
    p90_ms: float
    times_ms: list[float]


def time_call(fn, *, warmup: int = 1, repeats: int = 5, threads: int | None = None, clock: str = "wall") -> Timing:
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be at least 1 and warmup at least 0")
    timer = cm.CLOCKS.get(clock)
    if timer is None:
        raise ValueError(f"clock must be one of {', '.join(cm.CLOCKS)}")
    times = []
    with thread_count(threads), torch.inference_mode():
        for _ in range(warmup):
            fn()
        for _ in range(repeats):
            t = timer()
            fn()
            times.append((timer() - t) * 1e3)
    q = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else times * 9
    return Timing(statistics.median(times), q[0], q[-1], times)


@contextmanager
def _native_stderr_silenced():
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
    from torch.profiler import ProfilerActivity, profile
    with tempfile.TemporaryDirectory() as tmp:
        with (_native_stderr_silenced() if quiet else nullcontext()), torch.inference_mode():
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                fn()
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    totals = [e["args"].get("Total Allocated", 0) for e in events if e.get("name") == "[memory]"]
    return max([0, *totals]) / 2**20


# ---------------------------------------------------------------- models and shapes
def load(spec: str):
    """A bundled key, a local folder, or a synthetic spec (random weights: timing only)."""
    from .loading import load_model, random_model
    if spec.strip().startswith("synthetic:"):
        cfg = parse_synthetic(spec)
        if cm.weights_mb(cfg) > memory_budget_mb():
            raise ValueError(f"{spec} needs {cm.weights_mb(cfg):,.0f} MB of weights, more than half the "
                             "memory available; choose fewer layers or a smaller d")
        return random_model(cfg, key=spec.strip())
    return load_model(spec)


def variant_name(v: Variant) -> str:
    return "fused" if v == SOFTMAX else v.label


def model_inputs(model, n: int) -> tuple[dict, int]:
    """Forward kwargs for n tokens (vision: the nearest square grid) and the real token count."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(n)
    if cfg.is_vision:
        side = max(1, round(math.sqrt(max(n - 1 - cfg.n_registers, 1))))
        px = torch.randn(1, cfg.n_channels, side * cfg.patch_size, side * cfg.patch_size, generator=g)
        return dict(pixel_values=px), 1 + cfg.n_registers + side * side
    return dict(input_ids=torch.randint(0, cfg.vocab_size, (1, n), generator=g)), n


# ---------------------------------------------------------------- sweeps
@dataclass
class SweepPlan:
    models: list[str]
    seq_lens: list[int]
    variants: list[str] = field(default_factory=lambda: ["fused"])
    heads: list[int] | None = None       # query heads kept per layer (first k); None: all
    threads: list[int] = field(default_factory=lambda: [torch.get_num_threads()])
    backends: list[str] = field(default_factory=lambda: ["cpu"])
    repeats: int = 5
    warmup: int = 1
    memory: bool = True
    clock: str = "wall"

    def check(self):
        if not self.models:
            raise ValueError("choose at least one model")
        if not self.seq_lens or any(int(n) < 1 for n in self.seq_lens):
            raise ValueError(f"sequence lengths must be positive whole numbers; got {self.seq_lens}")
        if any(int(t) < 1 for t in self.threads) or not self.threads:
            raise ValueError(f"thread counts must be at least 1; got {self.threads}")
        if self.heads is not None and any(int(k) < 1 for k in self.heads):
            raise ValueError(f"head counts must be at least 1; got {self.heads}")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be at least 1 and warmup at least 0")
        bad = [b for b in self.backends if b not in BACKENDS]
        if bad or not self.backends:
            raise ValueError(f"unknown backend {bad}; choose from {', '.join(BACKENDS)}")
        if self.clock not in cm.CLOCKS:
            raise ValueError(f"clock must be one of {', '.join(cm.CLOCKS)}")
        if not self.variants:
            raise ValueError("choose at least one attention variant")
        for v in self.variants:
            parse_variant(v)
        return self

    def points(self, configs: dict[str, Config]) -> list[tuple]:
        """(model key, head count, Variant, threads, n) for every combination, checked against each shape."""
        self.check()
        out = []
        for key in self.models:
            cfg = configs[key]
            for k in self.heads or [cfg.n_heads]:
                if k > cfg.n_heads:
                    raise ValueError(f"{key} has {cfg.n_heads} heads per layer; cannot keep {k}")
                for n in self.seq_lens:
                    if n > cfg.max_positions and cfg.positional == "learned" and not cfg.is_vision:
                        raise ValueError(f"sequence length {n} is beyond {key}'s {cfg.max_positions} "
                                         "positions; choose shorter sequences or another model")
                for v in self.variants:
                    for t in self.threads:
                        out += [(key, int(k), parse_variant(v), int(t), int(n)) for n in self.seq_lens]
        return out


@dataclass
class Estimate:
    seconds: float
    peak_mb: float   # weights of the largest model + its largest activations
    points: int

    def check(self, max_seconds: float | None, max_mb: float | None):
        if max_mb is not None and self.peak_mb > max_mb:
            raise ValueError(f"this sweep needs about {self.peak_mb:,.0f} MB of memory (budget {max_mb:,.0f} MB): "
                             "choose shorter sequences, the fused or chunked variant, or a smaller model")
        if max_seconds is not None and self.seconds > max_seconds:
            raise ValueError(f"this sweep would take about {self.seconds:,.0f} s (budget {max_seconds:,.0f} s): "
                             "choose fewer or shorter sequences, fewer variants, or fewer repeats")


def configs_of(keys, loader=None) -> dict[str, Config]:
    """Shapes without building synthetic models (so budgets are checked before any allocation)."""
    loader = loader or load
    return {k: parse_synthetic(k) if k.strip().startswith("synthetic:") else loader(k).cfg for k in keys}


def estimate(plan: SweepPlan, configs: dict[str, Config], profile: cm.DeviceProfile = cm.HOST_GUESS) -> Estimate:
    """Time and memory of a sweep from the cost model, before running it."""
    seconds, peak, pts = 0.0, 0.0, plan.points(configs)
    measured = "cpu" in plan.backends
    runs = plan.warmup + plan.repeats + (3 if plan.memory else 0)  # the profiled pass costs ~3 runs
    for key, k, v, t, n in pts:
        cfg = configs[key]
        shape = cfg if k == cfg.n_heads else with_heads(cfg, k)
        if measured:
            seconds += runs * cm.predict(shape, n, profile, v, threads=t).total_ms / 1e3
        peak = max(peak, cm.weights_mb(cfg) + cm.activation_mb(cfg, n, v))
    return Estimate(seconds, peak, len(pts))


def memory_budget_mb() -> float:
    """Half of the memory available now (psutil when installed, else /proc/meminfo)."""
    try:
        import psutil
        return psutil.virtual_memory().available / 2**20 / 2
    except ImportError:
        with open("/proc/meminfo") as f:
            kb = next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable"))
        return kb / 1024 / 2


@functools.lru_cache(maxsize=16)
def host_profile(threads: int, clock: str = "wall", quick: bool = True) -> cm.DeviceProfile:
    """This machine's profile at this thread count, calibrated once per process."""
    return cm.calibrate_host(threads=threads, quick=quick, clock=clock)


def host_model_error(df: pd.DataFrame) -> pd.DataFrame:
    """Measured rows against this host's profile, calibrated at each row's thread count and clock."""
    from .latency_figures import model_error  # plotly stays out of the CLI's imports
    measured = df[df["measured"]]
    return pd.concat([model_error(g, host_profile(int(t), str(c)))
                      for (t, c), g in measured.groupby(["threads", "clock"])], ignore_index=True)


def run_sweep(plan: SweepPlan, models: dict, *, progress=None, quiet: bool = False,
              profiles: dict | None = None) -> pd.DataFrame:
    """Measure (backend cpu) and model (cpu-model, pi4, pi5) every point. progress(done, total, label).
    `profiles` replaces the published Pi profiles, e.g. by ones recalibrated from a real Pi's CSV."""
    pts = plan.points({k: m.cfg for k, m in models.items()})
    profiles = dict(cm.PROFILES, **(profiles or {}))
    meta = dict(machine_metadata(), timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    rows, pruned = [], {}
    for i, (key, k, v, t, n) in enumerate(pts):
        model = models[key]
        if k != model.cfg.n_heads:
            if (key, k) not in pruned:
                keep = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, dtype=torch.bool)
                keep[:, :k] = True
                pruned[(key, k)] = model.prune(keep)
            model = pruned[(key, k)]
        if progress:
            progress(i, len(pts), f"{key} · {variant_name(v)} · {k} heads · {t} threads · n={n}")
        base = dict(schema=SCHEMA, model=key, shape=config_spec(models[key].cfg), variant=variant_name(v),
                    n_heads=k, threads=t, repeats=plan.repeats, warmup=plan.warmup, clock=plan.clock, **meta)
        inputs, tokens = model_inputs(model, n)  # vision: the nearest square grid, so tokens may differ from n
        for backend in plan.backends:
            if backend == "cpu":
                run = lambda: model.net(**inputs, variants=v, logits=True)  # noqa: E731
                tm = time_call(run, warmup=plan.warmup, repeats=plan.repeats, threads=t, clock=plan.clock)
                mem = float("nan")
                if plan.memory:
                    with thread_count(t):
                        mem = peak_memory_mb(run, quiet=quiet)
                rows.append(dict(base, backend="cpu", measured=True, seq_len=tokens, median_ms=tm.median_ms,
                                 p10_ms=tm.p10_ms, p90_ms=tm.p90_ms, peak_mem_mb=mem))
            else:
                prof = host_profile(t, plan.clock) if backend == "cpu-model" else profiles[backend]
                pred = cm.predict(model.cfg, tokens, prof, v, threads=t)
                rows.append(dict(base, backend=backend, measured=False, seq_len=tokens, median_ms=pred.total_ms,
                                 p10_ms=pred.total_ms, p90_ms=pred.total_ms,
                                 peak_mem_mb=cm.activation_mb(model.cfg, tokens, v),
                                 **{f"{g}_ms": ms for g, ms in pred.by_group.items()}))
    if progress:
        progress(len(pts), len(pts), "done")
    df = pd.DataFrame(rows).reindex(columns=COLUMNS)
    df["tokens_per_s"] = df["seq_len"] / (df["median_ms"] / 1e3)
    return df


def parse_int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in re.split(r"[,\s]+", str(text).strip()) if x]
    except ValueError:
        raise ValueError(f"{what} must be whole numbers separated by commas, e.g. 16,32,64; got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{what} must be positive whole numbers; got {text!r}")
    return values


# ---------------------------------------------------------------- CLI
def main(argv=None) -> int:
    import argparse
    import sys
    from tqdm import tqdm

    ap = argparse.ArgumentParser(prog="python -m attnviz.bench", description=(
        "Latency and peak memory of one forward pass versus sequence length: measured on this CPU "
        "(backend cpu) and modelled for a Raspberry Pi (pi4, pi5) or by this host's calibrated profile "
        "(cpu-model). Runs unchanged on a Pi with an aarch64 torch; upload its --out CSV to the Latency page."))
    ap.add_argument("--model", action="append", help="bundled key (minilm, smollm2, dinov2), local HF folder, "
                    "or synthetic:layers=6,d=384,heads=8[,kv=,dh=,ff=,vocab=,positions=,causal=1]; repeatable "
                    "(default minilm)")
    ap.add_argument("--seq-lens", default="16,32,64,128,256", help="comma-separated token counts")
    ap.add_argument("--variants", default="fused", help="comma-separated: fused, eager, chunked[:C], "
                    "local[:W], linear, relu, topk[:K]")
    ap.add_argument("--heads", default="all", help="query heads kept per layer (first k, pruned), e.g. 4,8; "
                    "'all' keeps every head")
    ap.add_argument("--threads", default=str(torch.get_num_threads()), help="comma-separated torch thread counts")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per point (median, p10, p90)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before them")
    ap.add_argument("--backend", default="cpu", help=f"comma-separated: {', '.join(BACKENDS)}")
    ap.add_argument("--clock", default="wall", choices=list(cm.CLOCKS), help="wall (perf_counter) or cpu "
                    "(process CPU time: robust on a busy machine, latency only with one thread)")
    ap.add_argument("--no-memory", action="store_true", help="skip the profiled pass that measures peak memory")
    ap.add_argument("--max-seconds", type=float, default=3600.0, help="refuse sweeps estimated to take longer")
    ap.add_argument("--max-mem-mb", type=float, default=None, help="refuse sweeps estimated to need more "
                    "memory (default: half of what is available)")
    ap.add_argument("--out", help="CSV file to write (default: the CSV goes to stdout)")
    args = ap.parse_args(argv)
    try:
        plan = SweepPlan(models=args.model or ["minilm"], seq_lens=parse_int_list(args.seq_lens, "--seq-lens"),
                         variants=[v for v in args.variants.split(",") if v.strip()],
                         heads=None if args.heads.strip() == "all" else parse_int_list(args.heads, "--heads"),
                         threads=parse_int_list(args.threads, "--threads"),
                         backends=[b.strip() for b in args.backend.split(",") if b.strip()],
                         repeats=args.repeats, warmup=args.warmup, memory=not args.no_memory, clock=args.clock)
        plan.check()
        configs = configs_of(plan.models)
        est = estimate(plan, configs)
        est.check(args.max_seconds, args.max_mem_mb or memory_budget_mb())
        sys.stderr.write(f"{est.points} points, about {est.seconds:,.0f} s, peak about {est.peak_mb:,.0f} MB\n")
        models = {key: load(key) for key in plan.models}
        bar = tqdm(total=1, file=sys.stderr, unit="point", disable=None)

        def progress(done, total, label):
            bar.total = total
            bar.set_description(label)
            bar.update(done - bar.n)

        df = run_sweep(plan, models, progress=progress, quiet=True)
        bar.close()
    except ValueError as err:
        ap.error(str(err))
    text = to_csv(df)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        sys.stderr.write(f"wrote {len(df)} rows to {args.out}\n")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
