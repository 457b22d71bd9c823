"""Sweeps of latency and memory versus sequence length: a checked plan, its estimate against time
and memory budgets before any work, and `run_sweep`, which measures (backend cpu, `measure`) and
models (cpu-model, pi4, pi5, `costmodel`) every point into the CSV schema of `results`.

Measured rows run in each chosen dtype torch runs here (MEASURED_DTYPES: fp32, and int8 / bf16
copies of the linear layers made by `quantize.quantized_copy`; the shared model is never changed).
With `crossover`, one block of each model is also timed at lengths that straddle the modelled
attention = rest crossover (`latency.crossover`; CSV test "block").

In a shared process (the app) nothing here changes torch's thread count: points at another count
are measured in a child process (`child`); the CLI, a process of its own, sets it directly
(`own_process=True`). A `jobs.Deadline` stops a sweep between measurements, keeping what was
measured (`df.attrs["stopped"]` says why).
"""
from __future__ import annotations

import math
import re
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pandas as pd
import torch

from attnviz.base.jobs import Cancel, Deadline, JobCancelled, JobTimeout, checks
from attnviz.base.timing import CLOCKS, Timing
from attnviz.core.attention import parse_variant
from attnviz.core.config import Config
from attnviz.latency import costmodel
from attnviz.latency.calibrate import host_profile
from attnviz.latency.crossover import block_crossover, block_split, estimate_seconds, lengths, measure_block, measured_row, modelled_rows, repeats_at, steady_profile
from attnviz.latency.pacing import Pacer
from attnviz.latency.quantize import quantized_copy
from attnviz.latency.child import measure_in_child
from attnviz.latency.engines import (DTYPES, MEASURED_DTYPES, NO_BF16, check_engine, engine_dtypes, engine_fit,
                                     engine_profile)
from attnviz.latency.measure import load, machine_metadata, measure_point, thread_count, token_count
from attnviz.latency.results import COLUMNS, MAX_SEQ_LEN, MAX_THREADS, SCHEMA, config_spec, parse_synthetic, with_heads

BACKENDS = ("cpu", "cpu-model", "pi4", "pi5")  # cpu is measured here; the others are the cost model
PI_BACKENDS = ("pi4", "pi5")
PI_CORES = 4              # a Raspberry Pi 4 / 5 has 4 cores: its rows are modelled at 4 threads by default
MAX_POINTS = 5000         # (model, heads, variant, threads, n) combinations of one sweep
MAX_REPEATS, MAX_WARMUP = 1000, 100


def few(values, k: int = 8) -> str:
    """The first k values, for a message."""
    values = list(values)
    return ", ".join(map(str, values[:k])) + (", …" if len(values) > k else "")


def check_budget(value, what: str, zero_ok: bool = False) -> float | None:
    """A time or memory budget: None (no budget) or a finite number above 0 (or 0 itself, when
    `zero_ok`). NaN would switch every comparison off, so it is refused like any other non-number."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number; got {value!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{what} must be a finite number {'of at least' if zero_ok else 'above'} 0; got {value!r}")
    return value


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
    engines: list[str] = field(default_factory=lambda: ["torch"])  # modelled Pi rows: each engine x dtype
    dtypes: list[str] = field(default_factory=lambda: ["fp32"])    # it runs (latency.engines)
    pi_threads: list[int] = field(default_factory=lambda: [PI_CORES])  # the Pi's threads, whatever this host has
    crossover: bool = False  # also one block at lengths straddling its modelled crossover (CLI: --crossover)

    def measured_dtypes(self) -> list[str]:
        """The dtypes the cpu rows are measured in: the chosen ones torch runs here, else fp32."""
        return [d for d in dict.fromkeys(self.dtypes) if d in MEASURED_DTYPES] or ["fp32"]

    def engine_pairs(self) -> list[tuple[str, str]]:
        """(engine, dtype) for every chosen engine and each chosen dtype it runs."""
        return [(e, d) for e in self.engines for d in self.dtypes if d in engine_dtypes(e)]

    def check(self):
        if not self.models:
            raise ValueError("choose at least one model")
        if not self.seq_lens or any(int(n) < 1 for n in self.seq_lens):
            raise ValueError(f"sequence lengths must be positive whole numbers; got {few(self.seq_lens)}")
        if any(int(n) > MAX_SEQ_LEN for n in self.seq_lens):
            raise ValueError(f"sequence lengths must be at most {MAX_SEQ_LEN:,} tokens; got {max(self.seq_lens):,}")
        if any(int(t) < 1 for t in self.threads) or not self.threads:
            raise ValueError(f"thread counts must be at least 1; got {few(self.threads)}")
        if any(int(t) > MAX_THREADS for t in self.threads):
            raise ValueError(f"thread counts must be at most {MAX_THREADS}; got {max(self.threads):,}")
        if self.heads is not None and any(int(k) < 1 for k in self.heads):
            raise ValueError(f"head counts must be at least 1; got {few(self.heads)}")
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
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {', '.join(CLOCKS)}")
        if not self.variants:
            raise ValueError("choose at least one attention variant")
        typos = [d for d in self.dtypes if d not in DTYPES]  # else silently fp32 rows
        if typos:
            raise ValueError(f"unknown dtype {few(typos)}; choose from {', '.join(DTYPES)}")
        for e in self.engines:
            check_engine(e, (engine_dtypes(e) or ("fp32",))[0])  # an unknown engine: its message
        for b, (e, d) in ((b, p) for b in self.backends if b in PI_BACKENDS for p in self.engine_pairs()):
            engine_fit(b, e, d)  # `engine@YEAR` with no published run of that release: its message
        idle = [e for e in self.engines if not any(d in engine_dtypes(e) for d in self.dtypes)]
        if any(b in PI_BACKENDS for b in self.backends) and idle and self.engine_pairs():  # else: the message below
            raise ValueError("; ".join(f"{e} runs {', '.join(engine_dtypes(e))}" for e in idle)
                             + f", none of the chosen dtypes ({', '.join(self.dtypes)}), so it would add no row: "
                               "choose one of its dtypes too, or leave it out")
        if any(b in PI_BACKENDS for b in self.backends) and not self.engine_pairs():
            raise ValueError(f"no chosen engine runs the chosen dtypes ({', '.join(self.dtypes)}) on a Pi: "
                             + "; ".join(f"{e} runs {', '.join(engine_dtypes(e))}" for e in self.engines)
                             + (f" ({NO_BF16})" if "bf16" in self.dtypes else ""))
        if not self.pi_threads or any(not 1 <= int(t) <= PI_CORES for t in self.pi_threads):
            raise ValueError(f"Pi thread counts must lie between 1 and {PI_CORES} (its cores); got {few(self.pi_threads)}")
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
    peak_mb: float   # on this host: weights of the largest model measured + its largest activations (0: none)
    points: int

    def check(self, max_seconds: float | None, max_mb: float | None):
        """ValueError when over a budget (None: no budget); a budget that is not a finite positive
        number (NaN, inf, 0, negative) is a ValueError too, never a check switched off."""
        max_seconds, max_mb = check_budget(max_seconds, "the time budget"), check_budget(max_mb, "the memory budget")
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


def estimate(plan: SweepPlan, configs: dict[str, Config], profile: costmodel.DeviceProfile = costmodel.HOST_GUESS) -> Estimate:
    """Time and memory of a sweep from the cost model, before running it."""
    seconds, peak, pts = 0.0, 0.0, plan.points(configs)
    measured = "cpu" in plan.backends
    runs = plan.warmup + plan.repeats + (3 if plan.memory else 0)  # the profiled pass costs ~3 runs
    dtypes = len(plan.measured_dtypes())
    for key, k, v, t, n in pts:
        cfg = configs[key]
        shape = cfg if k == cfg.n_heads else with_heads(cfg, k)
        if measured:
            seconds += dtypes * runs * costmodel.predict(shape, n, profile, v, threads=t).total_ms / 1e3
            # host memory: only what runs here (modelled rows build no model; `pi_memory` prices a Pi's)
            peak = max(peak, costmodel.weights_mb(cfg) * (1 + (dtypes > 1)) + costmodel.activation_mb(cfg, n, v))
    if plan.crossover and measured:
        v0 = parse_variant(plan.variants[0])
        seconds += sum(estimate_seconds(configs[key], profile, v0, plan.repeats, plan.warmup) for key in plan.models)
    return Estimate(seconds, peak, len(pts))


class Ended(Exception):
    """A sweep that ended early for a reason other than its deadline (a child process failed)."""


def modelled_profiles(plan: SweepPlan, backend: str, t: int, profiles=costmodel.PROFILES, given=(),
                      own_process: bool = False) -> list[tuple]:
    """(engine, dtype, threads, profile) of each modelled row of `backend` at a point of `t` threads: a Pi's
    once per point, at its threads x engine x dtype; cpu-model's at t. `given`: Pi profiles fitted to a real Pi."""
    if backend in PI_BACKENDS:
        return [] if t != plan.threads[0] else [
            (e, d, int(pt), profiles[backend] if backend in given and (e, d) == ("torch", "fp32")
             else engine_profile(profiles[backend], e, d)) for pt in plan.pi_threads for e, d in plan.engine_pairs()]
    cpu = backend == "cpu-model"
    return [("torch", "fp32", t, host_profile(t, plan.clock, own_process=own_process))] if cpu else []


def run_sweep(plan: SweepPlan, models: dict, *, progress=None, quiet: bool = False,
              profiles: dict | None = None, deadline: Deadline | None = None,
              own_process: bool = False, cancel: Cancel | None = None) -> pd.DataFrame:
    """Measure (backend cpu) and model (cpu-model, pi4, pi5) every point. progress(done, total, label).
    `profiles` replaces the published Pi profiles, e.g. by ones recalibrated from a real Pi's CSV.

    Points at this process's thread count are measured here; others in a child process (the CLI),
    unless `own_process` (a CLI or script) lets this process set its thread count itself.
    `deadline` stops the sweep between measurements: the rows measured so far are returned and
    `df.attrs["stopped"]` says why (else ""); so does a child process that failed, and `cancel`
    (e.g. the browser session that started the sweep went away)."""
    if deadline is not None:
        check_budget(deadline.seconds, "the sweep's deadline (seconds)", zero_ok=True)
    pts = plan.points({k: m.cfg for k, m in models.items()})
    given = set(profiles or {})
    profiles = dict(costmodel.PROFILES, **(profiles or {}))
    meta = dict(machine_metadata(), timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    now = torch.get_num_threads()
    measured_here = "cpu" in plan.backends
    elsewhere = sorted({t for *_, t, _ in pts if t != now}) if measured_here and not own_process else []
    pruned, twins, dtypes = {}, {}, plan.measured_dtypes()

    def shaped(key, k):
        model = models[key]
        if k != model.cfg.n_heads and (key, k) not in pruned:
            keep = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, dtype=torch.bool)
            keep[:, :k] = True
            pruned[(key, k)] = model.prune(keep)
        return model if k == model.cfg.n_heads else pruned[(key, k)]

    def typed(key, k, dtype):  # an int8 / bf16 copy (made once), never the shared model changed
        if dtype == "fp32":
            return shaped(key, k)
        if (key, k, dtype) not in twins:
            twins[(key, k, dtype)] = quantized_copy(shaped(key, k), dtype)
        return twins[(key, k, dtype)]

    def base(key, k, v, t):
        return dict(schema=SCHEMA, model=key, shape=config_spec(models[key].cfg), variant=v.name, n_heads=k,
                    threads=t, repeats=plan.repeats, warmup=plan.warmup, clock=plan.clock, engine="torch",
                    dtype="fp32", **meta)

    def modelled(row, cfg, tokens, v, prof, t):
        pred = costmodel.predict(cfg, tokens, prof, v, threads=t)
        return dict(row, measured=False, seq_len=tokens, median_ms=pred.total_ms, p10_ms=pred.total_ms,
                    p90_ms=pred.total_ms, peak_mem_mb=costmodel.activation_mb(cfg, tokens, v),
                    **{f"{g}_ms": ms for g, ms in pred.by_group.items()})

    # 1. every modelled row first: they cost nothing, so no budget stop can drop a configuration's model
    rows = []
    for key, k, v, t, n in pts:
        model = shaped(key, k)
        tokens = token_count(model.cfg, n)
        for backend in plan.backends:
            for engine, dtype, pt, prof in modelled_profiles(plan, backend, t, profiles, given, own_process):
                rows.append(modelled(dict(base(key, k, v, pt), backend=backend, engine=engine, dtype=dtype),
                                     model.cfg, tokens, v, prof, pt))
    # one block at lengths straddling its modelled crossover, at the thread count measured here
    blocks, t_block, v_block = [], plan.threads[0] if own_process else now, parse_variant(plan.variants[0])
    left_out = ""  # why the one-block rows are missing, when the deadline came first
    for key in plan.models if plan.crossover and measured_here else ():
        cfg = models[key].cfg
        try:  # t_block: this process's own; paced, so the calibrations cannot run past the deadline
            prof = steady_profile(t_block, plan.clock, own_process=own_process, check=Pacer(deadline).ahead)
        except (JobTimeout, JobCancelled) as err:
            left_out = f"{err} while calibrating the one-block crossover, which was left out"
            break
        n_cross = block_crossover(cfg, prof, v_block)
        if n_cross is not None:  # linear-cost variants never cross
            ns = lengths(n_cross)
            rows += modelled_rows(base(key, cfg.n_heads, v_block, t_block), cfg, prof, v_block, ns)
            blocks += [(n / n_cross, j, key, n, n_cross) for j, n in enumerate(ns)]
    blocks.sort()  # shorter lengths of every model first: a budget stop loses the longest
    # 2. measured points interleaved across configurations (n by n, every configuration at each n):
    # a budget stop then loses the longest lengths of every configuration, never a configuration
    here = sorted(((*p, d) for p in pts if measured_here and p[3] not in elsewhere for d in dtypes),
                  key=lambda p: (p[4], pts.index(p[:5]), dtypes.index(p[5])))
    total = len(here) + sum(repeats_at(n, c, plan.repeats) for *_, n, c in blocks) + len(elsewhere)
    done, stopped, block_runs = 0, "", {}  # (model, n) -> (block seconds, attention seconds)
    # the model's price of each run, for the pacer: it stops before a run that would end past the
    # deadline and says how long is left at the pace timed here (`latency.pacing`)
    guess = costmodel.HOST_GUESS
    runs = plan.warmup + plan.repeats + (3 if plan.memory else 0)
    point_cost = {p: costmodel.predict(shaped(p[0], p[1]).cfg, p[4], guess, p[2], threads=p[3]).total_ms for p in here}
    block_cost = {(key, n): sum(block_split(models[key].cfg, n, guess, v_block).values()) * 2 for *_, key, n, _ in blocks}
    pacer = Pacer(deadline, sum(point_cost.values()) * runs + sum(
        block_cost[(key, n)] * repeats_at(n, nc, plan.repeats) for _, _, key, n, nc in blocks))
    check = checks(pacer, cancel)

    def say(label):
        if progress:
            left = pacer.eta()
            progress(done, total, label + ("" if left is None else f" · about {left:,.0f} s left"))

    def block_rows():
        out = [measured_row(base(key, models[key].cfg.n_heads, v_block, t_block), n, Timing.of(b), Timing.of(a))
               for (key, n), (b, a) in block_runs.items()]
        block_runs.clear()
        return out
    try:
        for key, k, v, t, n, dtype in here:
            check()
            model = typed(key, k, dtype)
            pacer.point(point_cost[(key, k, v, t, n, dtype)], runs)
            say(f"{key} · {v.name} · {k} heads · {t} threads · {dtype} · n={n}")
            with thread_count(t) if own_process else nullcontext():
                point = measure_point(model, n, v, warmup=plan.warmup, repeats=plan.repeats, threads=t,
                                      clock=plan.clock, memory=plan.memory, quiet=quiet, check=check)
            tm = point.timing
            rows.append(dict(base(key, k, v, t), backend="cpu", measured=True, seq_len=point.tokens, dtype=dtype,
                             median_ms=tm.median_ms, p10_ms=tm.p10_ms, p90_ms=tm.p90_ms, peak_mem_mb=point.peak_mem_mb))
            done += 1
        for r in range(plan.repeats):  # round by round across the lengths: a busy host's drift falls on all
            for _, _, key, n, n_cross in blocks:
                if r >= repeats_at(n, n_cross, plan.repeats):
                    continue
                pacer.point(block_cost[(key, n)])
                check()
                say(f"{key} · one block · {v_block.name} · {t_block} threads · n={n} · run {r + 1}")
                with thread_count(t_block) if own_process else nullcontext():
                    block, att = measure_block(models[key], n, v_block, repeats=1, warmup=plan.warmup * (r == 0),
                                                  clock=plan.clock, check=check)
                runs = block_runs.setdefault((key, n), ([], []))
                runs[0].extend(block.times), runs[1].extend(att.times)
                done += 1
        rows += block_rows()
        for j, t in enumerate(elsewhere):
            check()
            if progress:
                progress(done + j, total, f"measuring at {t} threads in a separate process…")
            try:
                child_rows, stopped_there = measure_in_child(plan, models, t, deadline)
            except JobTimeout:
                raise
            except ValueError as err:  # the child failed: keep what was measured here, say why
                raise Ended(str(err)) from None
            rows += child_rows
            if stopped_there:
                deadline.check()  # past the deadline: its message
                raise JobTimeout(f"{deadline.what} stopped at its time limit of {deadline.seconds:g} s")
    except (JobTimeout, JobCancelled, Ended) as err:
        rows += block_rows()  # the lengths with at least one run
        measured = sum(1 for r in rows if r.get("measured") is True)
        got = {(r["model"], r["variant"], r["n_heads"], r["threads"], r["seq_len"], r["dtype"], r.get("test", ""))
               for r in rows if r.get("measured")}
        skipped = [f"{p[0]} {p[2].name} {p[1]}h {p[3]}t {d} n={p[4]}" for p in pts for d in dtypes if measured_here and
                   (p[0], p[2].name, p[1], p[3], token_count(models[p[0]].cfg, p[4]), d, "") not in got]
        skipped += [f"{key} one block n={n}" for _, _, key, n, _ in blocks if (key, v_block.name, models[key].cfg.n_heads,
                                                                             t_block, n, "fp32", "block") not in got]
        stopped = (f"{err}; kept the {measured} measured point{'s' * (measured != 1)} finished before it (every "
                   "modelled row is kept); " + (f"not measured: {few(skipped)}" if skipped else
                                                "every point had at least one timed run"))
    stopped = "; ".join(m for m in (left_out, stopped) if m)
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
