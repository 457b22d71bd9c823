"""This machine's cost-model profile, from microbenchmarks (`calibrate_host`), once per process and
thread count (`host_profile`, in a child process for a count other than this process's); and any
profile fitted to measurements (`recalibrate`), e.g. a real Raspberry Pi's CSV."""
from __future__ import annotations

import functools
import json
import math
import os
import statistics
from dataclasses import replace
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from attnviz.base.limits import LIMITS
from attnviz.base.timing import CLOCKS, measure
from attnviz.core.attention import parse_variant
from attnviz.core.blocks import Linear
from attnviz.latency.child import CALIBRATE_TIMEOUT_S, run_child, tail
from attnviz.latency.costmodel import F32, DeviceProfile, model_ops, op_counts, op_seconds
from attnviz.latency.results import MAX_MS, MIN_MS, parse_synthetic
from attnviz.weights.catalogue import random_model

MAX_FIT_FACTOR = 1e4  # a fit that makes a device 10,000 x faster or slower than its profile is a unit error


def calibrate_host(threads: int | None = None, quick: bool = False, clock: str = "wall",
                   own_process: bool = False) -> DeviceProfile:
    """Microbenchmarks here (a few seconds): matmul GFLOP/s at the sizes transformers use, the
    fused kernel, vector maths, cache / DRAM bandwidth, page faults and the per-call overhead.

    clock: 'wall' (perf_counter) or 'cpu' (this process's CPU time: with one thread it ignores the
    time other programs take from a shared machine; meaningless for latency with several threads).

    threads: torch's thread count is process-wide, so a thread count other than this process's
    is refused unless `own_process` says the caller owns the process (a CLI or script): a server
    that changed it would change it for every session. `host_profile` calibrates
    other thread counts in a child process."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}")
    reps = 3 if quick else 7
    old = torch.get_num_threads()
    threads = int(threads or old)
    if threads < 1:
        raise ValueError("threads must be at least 1")
    if threads != old and not own_process:
        raise ValueError(f"this process runs torch on {old} thread(s); calibrating at {threads} would change "
                         "it for everything else in the process. Use attnviz.latency.calibrate.host_profile (a child "
                         "process) or pass own_process=True from a script of your own")

    def secs(fn, repeats=reps):  # median seconds of `repeats` runs after one warm-up run
        return measure(fn, repeats, 1, clock=clock).median

    if threads != old:
        torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            # linear layers, weights cycled through a pool bigger than the cache (as in a real model),
            # through the same Linear the model uses (oneDNN-prepacked when the limits allow it)
            pool, turn = [Linear(384, 1536, bias=False) for _ in range(24)], iter(range(10**9))  # 57 MB
            if LIMITS.packed_linear:
                for layer in pool:
                    layer.pack()
            gemm = {}
            for rows in (4, 16, 64, 256):
                x = torch.randn(rows, 384)
                gemm[rows] = 2 * rows * 384 * 1536 / secs(lambda: pool[next(turn) % 24](x), 12 * reps) / 1e9
            peak = max(gemm.values())
            half = statistics.median(r * (peak / g - 1) for r, g in gemm.items() if g < peak)
            # per-head matmuls at n = 512, d_head 32 and 64: scores (n x dh x n) and weights x V (n x n x dh)
            bmm = []
            for h, dh in ((12, 32), (9, 64)):
                q, k, w = torch.randn(h, 512, dh), torch.randn(h, dh, 512), torch.randn(h, 512, 512)
                bmm += [2 * h * 512 * 512 * dh / secs(f) / 1e9 for f in (lambda: torch.bmm(q, k),
                                                                       lambda: torch.bmm(w, q))]
            bmm = statistics.median(bmm)
            q4 = torch.randn(1, 8, 512, 64)
            sdpa = (4 * 64 + 8) * 8 * 512 * 512 / secs(lambda: F.scaled_dot_product_attention(q4, q4, q4)) / 1e9
            s = torch.randn(8, 128, 128)  # 0.5 MB: in cache; 12 "flops" per softmax element as in model_ops
            vector = 12 * s.numel() / secs(lambda: torch.softmax(s, -1), 3 * reps) / 1e9
            a, b = torch.randn(2**18), torch.randn(2**18)  # 1 MB each
            cache = 3 * F32 * a.numel() / secs(lambda: a.add_(b), 3 * reps) / 1e9
            a, b = torch.randn(2**25), torch.randn(2**25)  # 128 MB each
            dram = 3 * F32 * a.numel() / secs(lambda: a.add_(b)) / 1e9
            del a, b
            big = 2**25  # 128 MB: above the mmap threshold, so every call faults its pages in
            fill = big * F32 / (dram * 1e9)
            fault = big * F32 / max(secs(lambda: torch.empty(big).fill_(1.0)) - fill, 1e-6) / 1e9
            # per-call overhead: our own Transformer on a tiny shape, divided by the calls model_ops counts
            tiny = []
            for spec in ("layers=2,d=8,heads=2,ff=8,vocab=16,positions=8",
                         "layers=2,d=8,heads=2,ff=8,vocab=16,positions=8,causal=1"):
                cfg = parse_synthetic(spec)
                net, ids = random_model(cfg).net, torch.zeros(1, 2, dtype=torch.long)
                calls = sum(op.calls for op in model_ops(cfg, 2))
                tiny.append(secs(lambda: net(input_ids=ids), 3 * reps) / calls * 1e6)
    finally:
        if torch.get_num_threads() != old:
            torch.set_num_threads(old)
    return DeviceProfile(
        name="cpu", gemm_gflops=peak, bmm_gflops=bmm, sdpa_gflops=sdpa, vector_gflops=vector, half_rows=half,
        dram_gbs=dram, cache_gbs=cache, cache_mb=16.0, fault_gbs=fault, overhead_us=statistics.mean(tiny),
        cores=os.cpu_count() or 1, threads=threads,
        source=f"calibrated here by microbenchmarks ({threads} thread{'s' * (threads > 1)}, {clock} clock)")


@functools.lru_cache(maxsize=16)
def host_profile(threads: int, clock: str = "wall", quick: bool = True, own_process: bool = False) -> DeviceProfile:
    """This machine's profile at this thread count, calibrated once per process: here at this
    process's own thread count (or any, with `own_process`), else in a child process."""
    if int(threads) == torch.get_num_threads() or own_process:
        return calibrate_host(threads=int(threads), quick=quick, clock=clock, own_process=own_process)
    args = ["--calibrate", "quick" if quick else "full", "--threads", str(int(threads)), "--clock", clock]
    out = run_child(args, CALIBRATE_TIMEOUT_S, f"calibrating this CPU at {threads} threads")
    try:
        return DeviceProfile(**json.loads(out.stdout.strip().splitlines()[-1]))
    except (ValueError, TypeError, IndexError):
        raise ValueError(f"calibrating this CPU at {threads} threads in a separate process gave no profile: "
                         f"{tail(out.stderr)}") from None


def recalibrate(profile: DeviceProfile, points, check: Callable[[], None] | None = None) -> DeviceProfile:
    """Fit a profile to measurements: points are (Config, n, variant, threads, measured_ms).

    The prediction splits into work (the roofline and page-fault terms) and per-call overhead;
    non-negative least squares finds how much faster or slower each is on the measured device,
    and the profile's throughputs and overhead are scaled by those two factors.

    A measured time outside [MIN_MS, MAX_MS], or a fit that makes the device more than
    MAX_FIT_FACTOR times faster or slower than the profile, is a ValueError: such numbers are a
    unit or typing error, and a profile fitted to them would predict nonsense for every later sweep."""
    rows, split = [], {}
    for cfg, n, variant, threads, ms in points:
        ms = float(ms)
        if not (math.isfinite(ms) and MIN_MS <= ms <= MAX_MS):
            raise ValueError(f"a measured time of {ms:g} ms (n = {int(n)}) is not a forward pass's: "
                             f"recalibration takes times between {MIN_MS:g} and {MAX_MS:g} ms")
        key = (cfg, int(n), parse_variant(variant), int(threads))
        if key not in split:  # a long CSV repeats a few points: model each once
            if check is not None:  # e.g. a Deadline: stops between points
                check()
            p = profile.at_threads(int(threads))
            ops = op_counts(cfg, int(n), variant)
            overhead = sum(count * op.calls for op, count in ops) * p.overhead_us * 1e-3
            split[key] = (sum(count * op_seconds(op, p) for op, count in ops) * 1e3 - overhead, overhead)
        work, overhead = split[key]
        rows.append([work / ms, overhead / ms])  # relative error: every point weighs the same
    if len(rows) < 2:
        raise ValueError("recalibration needs at least two measured points (e.g. two sequence lengths)")
    A, ones = np.array(rows), np.ones(len(rows))
    if not np.isfinite(A).all():
        raise ValueError("these measurements cannot be modelled (a predicted time overflowed); "
                         "check the CSV's shapes and times")
    w, o = np.linalg.lstsq(A, ones, rcond=None)[0]
    if o <= 0:  # overhead not identifiable (long sequences only): fit the work alone, keep the overhead
        w, o = float(np.linalg.lstsq(A[:, :1], ones - A[:, 1], rcond=None)[0][0]), 1.0
    if not (math.isfinite(w) and w > 0 and math.isfinite(o)):
        raise ValueError("these measurements cannot be explained by this profile (no positive fit); "
                         "check that the CSV's shapes and variants match what was run")
    for factor, what in ((w, "work"), (o, "per-call overhead")):
        if not 1 / MAX_FIT_FACTOR <= factor <= MAX_FIT_FACTOR:
            raise ValueError(f"these measurements make the device's {what} {factor:.3g} x the {profile.name} "
                             f"profile's, beyond any real device (at most {MAX_FIT_FACTOR:g} x either way); "
                             "check that median_ms is in milliseconds and the shapes match what was run")
    return replace(profile, name=f"{profile.name} (recalibrated)",
                   gemm_gflops=profile.gemm_gflops / w, bmm_gflops=profile.bmm_gflops / w,
                   sdpa_gflops=profile.sdpa_gflops / w, vector_gflops=profile.vector_gflops / w,
                   dram_gbs=profile.dram_gbs / w, cache_gbs=profile.cache_gbs / w, fault_gbs=profile.fault_gbs / w,
                   overhead_us=profile.overhead_us * o,
                   source=f"{profile.source}; recalibrated on {len(rows)} measured points "
                          f"(work x{w:.2f}, overhead x{o:.2f})")
