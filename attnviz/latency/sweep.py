"""Latency and memory versus sequence length: timing, sweeps, budgets, the CSV the CLI writes and
the page imports, machine metadata. The cost model lives in `costmodel`; the CLI is `main`.

Timing: `time.perf_counter` (wall) by default, or this process's CPU time (`clock="cpu"`), which
on a shared machine ignores time other programs take, and equals latency only with one thread.
Memory: the peak of torch's CPU allocations during one extra forward pass, read from the
profiler's memory events (tracemalloc does not see torch; RSS hides freed-and-reused pages):
activations and workspace only; the weights are reported by `costmodel.weights_mb`.

Threads: torch's thread count is process-wide. In a shared process (the app) nothing here changes
it: points at another thread count are measured, and profiles calibrated, in a child process
(`python -m attnviz.bench`, with a hard timeout); the CLI, a process of its own, sets it directly
(`own_process=True`). A `jobs.Deadline` stops a sweep between measurements, keeping what was
measured (`df.attrs["stopped"]` says why).
"""
from __future__ import annotations

import functools
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from attnviz.latency import costmodel as cm
from attnviz.core.attention import SOFTMAX, Variant, parse_variant
from attnviz.core.config import Config
from attnviz.base.jobs import Deadline, JobTimeout
from attnviz.latency.results import (COLUMNS, MAX_SEQ_LEN, MAX_THREADS, SCHEMA, config_spec, parse_synthetic,  # noqa: F401
                      read_results, to_csv, with_heads)

BACKENDS = ("cpu", "cpu-model", "pi4", "pi5")  # cpu is measured here; the others are the cost model
MAX_POINTS = 5000         # (model, heads, variant, threads, n) combinations of one sweep
MAX_REPEATS, MAX_WARMUP = 1000, 100
CHILD_GRACE_S = 60.0      # a child sweep is killed this long after its deadline (start-up, last point, CSV)
CALIBRATE_TIMEOUT_S = 300.0  # a child calibration is killed after this
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
STOPPED_EXIT = 3          # the CLI's exit status when --deadline stopped it (the CSV holds what it measured)


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


@dataclass
class Timing:
    median_ms: float
    p10_ms: float
    p90_ms: float
    times_ms: list[float]


def time_call(fn, *, warmup: int = 1, repeats: int = 5, threads: int | None = None, clock: str = "wall",
              deadline: Deadline | None = None) -> Timing:
    """Median, p10 and p90 of `repeats` runs after `warmup` runs. `threads` (if given) must be this
    process's thread count: this never changes it (wrap in `thread_count` in a process of your own).
    `deadline` is checked before every run (JobTimeout)."""
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be at least 1 and warmup at least 0")
    timer = cm.CLOCKS.get(clock)
    if timer is None:
        raise ValueError(f"clock must be one of {', '.join(cm.CLOCKS)}")
    if threads and int(threads) != torch.get_num_threads():
        raise ValueError(f"this process runs torch on {torch.get_num_threads()} thread(s), not {threads}: "
                         "measure other thread counts with `python -m attnviz.bench --threads N` (run_sweep "
                         "does that in a child process)")
    times = []
    with torch.inference_mode():
        for _ in range(warmup):
            if deadline:
                deadline.check()
            fn()
        for _ in range(repeats):
            if deadline:
                deadline.check()
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
    from attnviz.weights.catalogue import load_model, random_model
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
def _few(values, k: int = 8) -> str:
    values = list(values)
    return ", ".join(map(str, values[:k])) + (", …" if len(values) > k else "")


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
            raise ValueError(f"sequence lengths must be positive whole numbers; got {_few(self.seq_lens)}")
        if any(int(n) > MAX_SEQ_LEN for n in self.seq_lens):
            raise ValueError(f"sequence lengths must be at most {MAX_SEQ_LEN:,} tokens; got {max(self.seq_lens):,}")
        if any(int(t) < 1 for t in self.threads) or not self.threads:
            raise ValueError(f"thread counts must be at least 1; got {_few(self.threads)}")
        if any(int(t) > MAX_THREADS for t in self.threads):
            raise ValueError(f"thread counts must be at most {MAX_THREADS}; got {max(self.threads):,}")
        if self.heads is not None and any(int(k) < 1 for k in self.heads):
            raise ValueError(f"head counts must be at least 1; got {_few(self.heads)}")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be at least 1 and warmup at least 0")
        if self.repeats > MAX_REPEATS or self.warmup > MAX_WARMUP:
            raise ValueError(f"repeats must be at most {MAX_REPEATS} and warmup at most {MAX_WARMUP}")
        size = (len(self.models) * len(self.heads or [0]) * len(self.variants or [0]) * len(self.threads)
                * len(self.seq_lens))
        if size > MAX_POINTS:
            raise ValueError(f"this sweep has {size:,} points (models x heads x variants x threads x lengths); "
                             f"at most {MAX_POINTS:,}: choose fewer")
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
def host_profile(threads: int, clock: str = "wall", quick: bool = True, own_process: bool = False) -> cm.DeviceProfile:
    """This machine's profile at this thread count, calibrated once per process: here at this
    process's own thread count (or any, with `own_process`), else in a child process."""
    if int(threads) == torch.get_num_threads() or own_process:
        return cm.calibrate_host(threads=int(threads), quick=quick, clock=clock, own_process=own_process)
    args = ["--calibrate", "quick" if quick else "full", "--threads", str(int(threads)), "--clock", clock]
    out = _run_child(args, CALIBRATE_TIMEOUT_S, f"calibrating this CPU at {threads} threads")
    try:
        return cm.DeviceProfile(**json.loads(out.stdout.strip().splitlines()[-1]))
    except (ValueError, TypeError, IndexError):
        raise ValueError(f"calibrating this CPU at {threads} threads in a separate process gave no profile: "
                         f"{_tail(out.stderr)}") from None


def host_model_error(df: pd.DataFrame) -> pd.DataFrame:
    """Measured rows against this host's profile, calibrated at each row's thread count and clock."""
    from attnviz.figures.latency import model_error  # plotly stays out of the CLI's imports
    measured = df[df["measured"]]
    return pd.concat([model_error(g, host_profile(int(t), str(c)))
                      for (t, c), g in measured.groupby(["threads", "clock"])], ignore_index=True)


# ---------------------------------------------------------------- child processes
def _tail(text: str, chars: int = 300) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "no message")[-chars:]


def _run_child(args: list[str], timeout: float | None, what: str) -> subprocess.CompletedProcess:
    """`python -m attnviz.bench ARGS` in a child process (its own torch thread count), killed after
    `timeout` seconds."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    try:
        return subprocess.run([sys.executable, "-m", "attnviz.bench", *args], capture_output=True, text=True,
                              env=env, cwd=str(PACKAGE_ROOT), timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise JobTimeout(f"{what} stopped at its time limit of {timeout:,.0f} s (a separate process, "
                         "stopped)") from None
    except OSError as err:
        raise ValueError(f"{what} could not start a separate process: {err}") from None


def _child_model_arg(key: str, model) -> str:
    """What the child loads for this model: its key when it can load it, else a random model of its shape."""
    from attnviz.weights.catalogue import BUNDLED
    key = key.strip()
    if key.startswith("synthetic:") or key in BUNDLED or os.path.isdir(key):
        return key
    return config_spec(model.cfg)


def _measure_in_child(plan: "SweepPlan", models: dict, threads: int, deadline: Deadline | None) -> tuple[list, bool]:
    """The cpu rows of the plan at `threads` threads, measured by the CLI in a child process, and
    whether the deadline stopped it (the rows are then those it finished)."""
    args = {key: _child_model_arg(key, model) for key, model in models.items() if key in plan.models}
    argv = [a for key in plan.models for a in ("--model", args[key])]
    variants = [v if isinstance(v, str) else variant_name(v) for v in plan.variants]
    argv += ["--seq-lens", ",".join(str(int(n)) for n in plan.seq_lens), "--variants", ",".join(variants),
             "--heads", "all" if plan.heads is None else ",".join(str(int(k)) for k in plan.heads),
             "--threads", str(int(threads)), "--repeats", str(plan.repeats), "--warmup", str(plan.warmup),
             "--backend", "cpu", "--clock", plan.clock, "--max-seconds", "1e12"]
    if not plan.memory:
        argv.append("--no-memory")
    timeout = None
    if deadline is not None and deadline.seconds is not None:
        remaining = max(deadline.remaining, 0.0)
        argv += ["--stop-at", repr(time.time() + remaining)]
        timeout = remaining + CHILD_GRACE_S
    what = f"measuring at {threads} threads"
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "sweep.csv")
        out = _run_child(argv + ["--out", out_file], timeout, what)
        if out.returncode not in (0, STOPPED_EXIT) or not os.path.isfile(out_file):
            raise ValueError(f"{what} in a separate process failed: {_tail(out.stderr)}")
        with open(out_file, "rb") as f:
            data = f.read()
    stopped = out.returncode == STOPPED_EXIT
    if stopped and len(data.strip().splitlines()) < 2:  # stopped before its first point
        return [], True
    df = read_results(data)
    back = {arg: key for key, arg in args.items()}
    df["model"] = df["model"].map(lambda m: back.get(m, m))
    df["shape"] = df["model"].map(lambda m: config_spec(models[m].cfg) if m in models else None)
    return df.reindex(columns=COLUMNS).to_dict("records"), stopped


class _Ended(Exception):
    """A sweep that ended early for a reason other than its deadline (a child process failed)."""


def run_sweep(plan: SweepPlan, models: dict, *, progress=None, quiet: bool = False,
              profiles: dict | None = None, deadline: Deadline | None = None,
              own_process: bool = False) -> pd.DataFrame:
    """Measure (backend cpu) and model (cpu-model, pi4, pi5) every point. progress(done, total, label).
    `profiles` replaces the published Pi profiles, e.g. by ones recalibrated from a real Pi's CSV.

    Points at this process's thread count are measured here; others in a child process (the CLI),
    unless `own_process` (a CLI or script) lets this process set its thread count itself.
    `deadline` stops the sweep between measurements: the rows measured so far are returned and
    `df.attrs["stopped"]` says why (else ""); so does a child process that failed."""
    pts = plan.points({k: m.cfg for k, m in models.items()})
    profiles = dict(cm.PROFILES, **(profiles or {}))
    meta = dict(machine_metadata(), timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    now = torch.get_num_threads()
    elsewhere = sorted({t for *_, t, _ in pts if t != now}) if "cpu" in plan.backends and not own_process else []
    total = len(pts) + len(elsewhere)
    rows, pruned, stopped = [], {}, ""
    try:
        for i, (key, k, v, t, n) in enumerate(pts):
            if deadline:
                deadline.check()
            model = models[key]
            if k != model.cfg.n_heads:
                if (key, k) not in pruned:
                    keep = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, dtype=torch.bool)
                    keep[:, :k] = True
                    pruned[(key, k)] = model.prune(keep)
                model = pruned[(key, k)]
            if progress:
                progress(i, total, f"{key} · {variant_name(v)} · {k} heads · {t} threads · n={n}")
            base = dict(schema=SCHEMA, model=key, shape=config_spec(models[key].cfg), variant=variant_name(v),
                        n_heads=k, threads=t, repeats=plan.repeats, warmup=plan.warmup, clock=plan.clock, **meta)
            inputs, tokens = model_inputs(model, n)  # vision: the nearest square grid, so tokens may differ from n
            for backend in plan.backends:
                if backend == "cpu":
                    if t in elsewhere:
                        continue  # measured in a child process below
                    run = lambda: model.net(**inputs, variants=v, logits=True)  # noqa: E731
                    with thread_count(t) if own_process else nullcontext():
                        tm = time_call(run, warmup=plan.warmup, repeats=plan.repeats, threads=t, clock=plan.clock,
                                       deadline=deadline)
                        mem = float("nan")
                        if plan.memory:
                            if deadline:
                                deadline.check()
                            mem = peak_memory_mb(run, quiet=quiet)
                    rows.append(dict(base, backend="cpu", measured=True, seq_len=tokens, median_ms=tm.median_ms,
                                     p10_ms=tm.p10_ms, p90_ms=tm.p90_ms, peak_mem_mb=mem))
                else:
                    prof = (host_profile(t, plan.clock, own_process=own_process) if backend == "cpu-model"
                            else profiles[backend])
                    pred = cm.predict(model.cfg, tokens, prof, v, threads=t)
                    rows.append(dict(base, backend=backend, measured=False, seq_len=tokens, median_ms=pred.total_ms,
                                     p10_ms=pred.total_ms, p90_ms=pred.total_ms,
                                     peak_mem_mb=cm.activation_mb(model.cfg, tokens, v),
                                     **{f"{g}_ms": ms for g, ms in pred.by_group.items()}))
        for j, t in enumerate(elsewhere):
            if deadline:
                deadline.check()
            if progress:
                progress(len(pts) + j, total, f"measuring at {t} threads in a separate process…")
            try:
                child_rows, stopped_there = _measure_in_child(plan, models, t, deadline)
            except JobTimeout:
                raise
            except ValueError as err:  # the child failed: keep what was measured here, say why
                raise _Ended(str(err)) from None
            rows += child_rows
            if stopped_there:
                deadline.check()  # past the deadline: its message
                raise JobTimeout(f"{deadline.what} stopped at its time limit of {deadline.seconds:g} s")
    except (JobTimeout, _Ended) as err:
        measured = sum(1 for r in rows if r.get("measured") is True)
        stopped = f"{err}; kept the {measured} measured point{'s' * (measured != 1)} finished before it"
    if progress:
        progress(total, total, "stopped" if stopped else "done")
    df = pd.DataFrame(rows).reindex(columns=COLUMNS)
    df["tokens_per_s"] = df["seq_len"] / (df["median_ms"] / 1e3)
    df.attrs["stopped"] = stopped
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
    ap.add_argument("--deadline", type=float, default=None, metavar="SECONDS", help="stop measuring after "
                    f"SECONDS, between points, and write what was measured (exit status {STOPPED_EXIT})")
    ap.add_argument("--stop-at", type=float, default=None, help=argparse.SUPPRESS)  # epoch seconds (the app)
    ap.add_argument("--calibrate", nargs="?", const="full", choices=["quick", "full"], default=None,
                    help="print this CPU's cost-model profile at the first --threads (JSON) and exit")
    ap.add_argument("--out", help="CSV file to write (default: the CSV goes to stdout)")
    args = ap.parse_args(argv)
    limits = [x for x in (args.deadline, None if args.stop_at is None else args.stop_at - time.time())
              if x is not None]
    deadline = Deadline(min(limits), "the sweep") if limits else None
    if args.calibrate:
        try:
            threads = parse_int_list(args.threads, "--threads")[0]
            if threads > MAX_THREADS:
                raise ValueError(f"--threads must be at most {MAX_THREADS}")
            prof = host_profile(threads, args.clock, quick=args.calibrate == "quick", own_process=True)
        except ValueError as err:
            ap.error(str(err))
        sys.stdout.write(json.dumps(asdict(prof)) + "\n")
        return 0
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

        df = run_sweep(plan, models, progress=progress, quiet=True, deadline=deadline, own_process=True)
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
    if df.attrs.get("stopped"):
        sys.stderr.write(f"stopped: {df.attrs['stopped']}\n")
        return STOPPED_EXIT
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
