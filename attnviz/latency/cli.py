"""`python -m attnviz.bench`: a latency sweep (or a calibration) in a process of its own, written as
the CSV the Latency page imports. Runs unchanged on a Raspberry Pi with an aarch64 torch.

Exit status: 0 done, 2 bad input (argparse's message on stderr), `child.STOPPED_EXIT` when
--deadline stopped the sweep (the CSV holds what was measured)."""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from attnviz.base.jobs import Deadline
from attnviz.base.timing import CLOCKS
from attnviz.latency.calibrate import host_profile
from attnviz.latency.child import MAX_SECONDS, STOPPED_EXIT
from attnviz.latency.engines import DTYPES, ENGINE_DTYPES, ENGINES, MEASURED_DTYPES
from attnviz.latency.measure import load, memory_budget_mb
from attnviz.latency import pi_memory, priced, published, speech_latency, translation_latency
from attnviz.latency.results import MAX_THREADS
from attnviz.latency.decode import decode_sweep
from attnviz.latency.sweep import (BACKENDS, PI_CORES, SweepPlan, configs_of, estimate,
                                   parse_int_list, run_sweep)


MAX_MB = 2.0**24  # 16 TB: a typo beyond (1e308 would overflow timeouts and sizes)


def number(lowest: float, above: bool, highest: float = math.inf, unit: str = ""):
    """An argparse type: a finite number above `lowest` (or at least it), at most `highest`. NaN and
    inf are refused: NaN compares false with everything, so a NaN budget or deadline would switch
    its check off."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give seconds or MB as a number")
        if value < lowest or (above and value == lowest):
            raise argparse.ArgumentTypeError(f"{text!r} must be {'above' if above else 'at least'} {lowest:g}")
        if value > highest:
            raise argparse.ArgumentTypeError(f"{text!r} is more than the largest allowed, {highest:,.0f}{unit}")
        return value
    return parse


def out_file(text: str) -> str:
    """An argparse type: a CSV file this process can write, checked before any work (a folder, a
    missing or read-only folder, or a full disk would otherwise fail after the sweep)."""
    path = Path(text).expanduser()
    where = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name in it, e.g. "
                                         f"{str(path / 'results.csv')!r}")
    if not where.is_dir():
        raise argparse.ArgumentTypeError(f"the folder of {text!r} does not exist; create it first")
    if not os.access(path if path.exists() else where, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r} cannot be written here (no permission); choose another place")
    free = shutil.disk_usage(where).free
    if free < 2**20:
        raise argparse.ArgumentTypeError(f"the disk holding {text!r} is full ({free:,} bytes free); free some "
                                         "space or choose another disk")
    return text


def parse_depths(text: str) -> list[int]:
    """KV-cache depths: whole numbers of at least 0 (0: generation right after the prompt)."""
    try:
        depths = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ValueError(f"--decode-depths must be whole numbers separated by commas, e.g. 0,128,512; got {text!r}") from None
    if not depths or min(depths) < 0:
        raise ValueError(f"--decode-depths must be whole numbers of at least 0; got {text!r}")
    return depths


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m attnviz.bench", description=(
        "Latency and peak memory of one forward pass versus sequence length: measured on this CPU "
        "(backend cpu) and modelled for a Raspberry Pi (pi4, pi5) or by this host's calibrated profile "
        "(cpu-model). Runs unchanged on a Pi with an aarch64 torch; upload its --out CSV to the Latency page."))
    ap.add_argument("--model", action="append", help="bundled key (minilm, smollm2, dinov2), local HF folder, "
                    "or synthetic:layers=6,d=384,heads=8[,kv=,dh=,ff=,vocab=,positions=,causal=1]; repeatable "
                    "(default minilm). Shapes the cost model prices without weights are modelled only (pi4, pi5, "
                    "cpu-model): a bottleneck transformer (synthetic:layers=24,d=512,bottleneck=128,heads=4,ff=512,"
                    "ffns=4, MobileBERT) and a network by its counts (synthetic:gflops=8.2,mparams=25.6[,calls=200])")
    ap.add_argument("--seq-lens", default="16,32,64,128,256", help="comma-separated token counts")
    ap.add_argument("--variants", default="fused", help="comma-separated: fused, eager, chunked[:C], "
                    "local[:W], linear, relu, topk[:K]")
    ap.add_argument("--heads", default="all", help="query heads kept per layer (first k, pruned), e.g. 4,8; "
                    "'all' keeps every head")
    ap.add_argument("--threads", default=str(torch.get_num_threads()), help="comma-separated torch thread counts")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per point (median, p10, p90)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before them")
    ap.add_argument("--backend", default="cpu", help=f"comma-separated: {', '.join(BACKENDS)}")
    ap.add_argument("--engine", default="torch", help="comma-separated engines the modelled Pi rows (pi4, pi5) run "
                    "on: " + "; ".join(f"{e} = {what} (dtypes {', '.join(ENGINE_DTYPES[e])})"
                                       for e, what in ENGINES.items()) + ". ENGINE@YEAR (e.g. ggml@2024) asks for the "
                    "profile of that year's release: refused, saying which release each profile models, when no "
                    "published run of it calibrates one. cpu rows are measured in torch")
    ap.add_argument("--dtype", default="fp32", help=f"comma-separated dtypes: {', '.join(DTYPES)} (fp32 float32; "
                    "fp16/bf16 half precision; int8 dynamic quantization of the linear layers; q8_0 / q4_0 ggml's "
                    "8- and 4-bit blocks). The modelled Pi rows: each engine at the dtypes it runs (no bf16: the "
                    "Pi's cores have no bf16 arithmetic); the measured cpu "
                    f"rows: each of {', '.join(MEASURED_DTYPES)} chosen (torch's own quantize_dynamic int8 and a bf16 "
                    "copy of the linear layers; fp32 when none is chosen)")
    ap.add_argument("--crossover", action=argparse.BooleanOptionalAction, default=False, help="also time ONE block "
                    "of each model at lengths straddling its modelled attention = rest crossover (every block has "
                    "the same shape; a block reads no positions, so MiniLM's 512 do not bind), with its attention "
                    "alone: extra CSV rows with test=block at lengths of their own, measured (cpu) and modelled "
                    "(cpu-model) (off by default: a plain sweep writes only the lengths asked for; needs the cpu "
                    "backend)")
    ap.add_argument("--pi-threads", default=str(PI_CORES), help=f"comma-separated threads of the modelled Pi rows, "
                    f"1-{PI_CORES} whatever this host has (default {PI_CORES}: a Pi 4 / 5 has {PI_CORES} cores)")
    ap.add_argument("--decode-depths", default=None, metavar="DEPTHS", help="also decode latency for causal LMs, "
                    "with llama-bench's meaning: pp N (a prompt of --n-prompt tokens in one pass, tokens/s) and tg "
                    "(one generated token at each KV-cache depth, tokens/s, as llama-bench -d); e.g. 0,128,512")
    ap.add_argument("--n-prompt", type=int, default=128, help="prompt tokens of the pp test (default 128)")
    ap.add_argument("--clock", default="wall", choices=list(CLOCKS), help="wall (perf_counter) or cpu "
                    "(process CPU time: robust on a busy machine, latency only with one thread)")
    ap.add_argument("--no-memory", action="store_true", help="skip the profiled pass that measures peak memory")
    ap.add_argument("--max-seconds", type=number(0, True, MAX_SECONDS, " s (a week)"), default=3600.0,
                    help="refuse sweeps estimated to take longer")
    ap.add_argument("--max-mem-mb", type=number(0, True, MAX_MB, " MB"), default=None, help="refuse sweeps "
                    "estimated to need more memory here (default: half of what is available)")
    ap.add_argument("--deadline", type=number(0, False, MAX_SECONDS, " s (a week)"), default=None,
                    metavar="SECONDS", help="stop measuring after SECONDS, between points, and write what was "
                    f"measured (exit status {STOPPED_EXIT})")
    ap.add_argument("--stop-at", type=number(0, above=False), default=None,
                    help=argparse.SUPPRESS)  # epoch seconds (the app's child processes)
    ap.add_argument("--calibrate", nargs="?", const="full", choices=["quick", "full"], default=None,
                    help="print this CPU's cost-model profile at the first --threads (JSON) and exit")
    ap.add_argument("--published", action="store_true", help="write every published Raspberry Pi run the "
                    "engines are fitted to or checked against (source, device, engine, dtype, shape, threads, "
                    "metric: ms, pp_tps, tg_tps or ms_per_gflop), with the cost model's prediction and its error, "
                    "as CSV, and exit")
    ap.add_argument("--out", type=out_file, help="CSV file to write (default: the CSV goes to stdout)")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    limits = [x for x in (args.deadline, None if args.stop_at is None else args.stop_at - time.time())
              if x is not None]
    deadline = Deadline(max(min(limits), 0.0), "the sweep") if limits else None
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
    if args.published:
        return translation_latency.write_csv(pd.DataFrame(published.table()), args.out, ap)
    if args.model and any(translation_latency.is_translator(k) for k in args.model):  # en-pt, pt-en: encode + per token
        return translation_latency.main(args, ap)
    if args.model and any(speech_latency.is_speech(k) for k in args.model):  # whisper: a 30 s window + per token
        return speech_latency.main(args, ap)
    try:
        plan = SweepPlan(models=args.model or ["minilm"], seq_lens=parse_int_list(args.seq_lens, "--seq-lens"),
                         variants=[v for v in args.variants.split(",") if v.strip()],
                         heads=None if args.heads.strip() == "all" else parse_int_list(args.heads, "--heads"),
                         threads=parse_int_list(args.threads, "--threads"),
                         backends=[b.strip() for b in args.backend.split(",") if b.strip()],
                         repeats=args.repeats, warmup=args.warmup, memory=not args.no_memory, clock=args.clock,
                         engines=[e.strip() for e in args.engine.split(",") if e.strip()],
                         dtypes=[d.strip() for d in args.dtype.split(",") if d.strip()],
                         pi_threads=parse_int_list(args.pi_threads, "--pi-threads"), crossover=args.crossover)
        plan.check()
        # shapes the cost model prices without a model (a bottleneck or an explicit FLOP count): modelled rows
        only_priced = [priced.priced_rows(plan, k, own_process=True) for k in plan.models if priced.is_priced_only(k)]
        plan.models = [key for key in plan.models if not priced.is_priced_only(key)]
        if not plan.models:
            return translation_latency.write_csv(pd.concat(only_priced, ignore_index=True), args.out, ap)
        configs = configs_of(plan.models)
        est = estimate(plan, configs)
        est.check(args.max_seconds, memory_budget_mb() if args.max_mem_mb is None else args.max_mem_mb)
        sys.stderr.write(f"{est.points} points, about {est.seconds:,.0f} s, peak about {est.peak_mb:,.0f} MB here\n")
        for fits, note in pi_memory.ram_notes(plan, configs):
            if not fits:  # a modelled row still prices it; the Pi could not hold it all
                sys.stderr.write(f"note: {note}\n")
        models = pi_memory.models_for(plan, configs, load)
        bar = tqdm(total=1, file=sys.stderr, unit="point", disable=None)

        def progress(done, total, label):
            bar.total = total
            bar.set_description(label)
            bar.update(done - bar.n)

        df = run_sweep(plan, models, progress=progress, quiet=True, deadline=deadline, own_process=True)
        bar.close()
        blocks = df[df["test"] == "block"]
        if len(blocks):  # rows at lengths nobody listed in --seq-lens: said, so no one plots them unawares
            sys.stderr.write(f"--crossover: added {len(blocks)} one-block rows (test=block) at n = "
                             f"{', '.join(map(str, sorted(set(blocks['seq_len'].astype(int)))))}, lengths straddling "
                             "each model's modelled attention = rest crossover\n")
        if args.decode_depths:
            depths = parse_depths(args.decode_depths)
            dec = decode_sweep(plan, models, depths, args.n_prompt, deadline=deadline, own_process=True)
            df = pd.concat([df, dec], ignore_index=True).reindex(columns=df.columns)
            df.attrs["stopped"] = df.attrs.get("stopped") or dec.attrs["stopped"]
        if only_priced:
            stopped = df.attrs.get("stopped", "")
            df = pd.concat([df, *only_priced], ignore_index=True).reindex(columns=df.columns)
            df.attrs["stopped"] = stopped
    except ValueError as err:
        ap.error(str(err))
    translation_latency.write_csv(df, args.out, ap)
    if df.attrs.get("stopped"):
        sys.stderr.write(f"stopped: {df.attrs['stopped']}\n")
        return STOPPED_EXIT
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
