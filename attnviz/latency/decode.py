"""Decode latency of a causal LM with a key/value cache, with llama-bench's meaning of its tests:
pp n (prompt processing: n prompt tokens in one pass, reported as n / seconds), tg (text generation:
one token at a time, each reading every earlier token's keys and values from the cache; tokens/s),
and depth d (`-d`: tokens already in the cache before the test). Modelled (`decode_ops`,
`predict_pp`, `predict_tg`) and measured here (`measure_decode`) through the one forward loop's
per-call cache (`Transformer.run_blocks(cache=...)`, the cache `analysis.generate` decodes with).
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone

import pandas as pd
import torch

from attnviz.base.timing import Timing, measure
from attnviz.core.attention import parse_variant
from attnviz.core.config import Config
from attnviz.base.jobs import Deadline, JobCancelled, JobTimeout
from attnviz.latency import costmodel
from attnviz.latency.costmodel import F32, DeviceProfile, Op, gemm_op, layer_ops, layer_runs, op_counts, op_seconds
from attnviz.latency.engines import engine_profile
from attnviz.latency.measure import machine_metadata, thread_count
from attnviz.latency.results import COLUMNS, SCHEMA, config_spec
from attnviz.latency.sweep import PI_BACKENDS, SweepPlan


def decode_ops(cfg: Config, depth: int) -> list[tuple[Op, int]]:
    """The ops of one generated token at cache depth `depth`: it attends to depth + 1 keys, or to
    its window's keys in a local layer (Gemma's 512), with each run of layers' own heads and K/V heads."""
    if not cfg.causal:
        raise ValueError("decode latency is for causal language models (SmolLM2, GPT-2, a causal synthetic shape)")
    if depth < 0:
        raise ValueError(f"depth must be 0 or more; got {depth}")
    dh = cfg.d_head
    out = [(Op("embedding", "other", "vector", 2 * cfg.d_model, 5 * F32 * cfg.d_model, calls=3), 1)]
    for h, kv, window, layers in layer_runs(cfg):
        S = min(depth + 1, window) if window else depth + 1
        attention = [Op("scores q K^T (cache)", "attention", "bmm", 2 * h * S * dh, F32 * h * S, rows=1,
                        weights=kv * S * dh),   # the cached keys: stored in the engine's dtype
                     Op("softmax", "attention", "vector", 12 * h * S, 2 * F32 * h * S, calls=2),
                     Op("weights x V (cache)", "attention", "bmm", 2 * h * S * dh, F32 * h * S, rows=1,
                        weights=kv * S * dh),
                     Op("append K/V", "attention", "vector", 0, 4 * F32 * kv * dh, calls=2)]
        for op in layer_ops(cfg, 1, parse_variant("eager"), h, kv):
            if op.group != "attention":
                out.append((op, layers))
            elif op.name.startswith("scores"):
                out += [(a, layers) for a in attention]
    out.append((gemm_op("LM head", "other", 1, cfg.d_model, cfg.vocab_size, False), 1))
    return out


def prefill_ops(cfg: Config, n: int, variant="fused") -> list[tuple[Op, int]]:
    """One pass over n prompt tokens; the LM head runs on the last one only (as llama.cpp does)."""
    ops = [(op, c) for op, c in op_counts(cfg, n, variant) if op.name != "LM head"]
    return ops + [(gemm_op("LM head", "other", 1, cfg.d_model, cfg.vocab_size, False), 1)]


def seconds(ops, profile: DeviceProfile, threads: int | None = None) -> float:
    p = profile.at_threads(threads) if threads else profile
    return sum(count * op_seconds(op, p) for op, count in ops)


def predict_tg(cfg: Config, profile: DeviceProfile, depth: int = 0, threads: int | None = None) -> float:
    """Generation tokens/s at cache depth `depth` (llama-bench tg at -d depth)."""
    return 1.0 / seconds(decode_ops(cfg, depth), profile, threads)


def predict_pp(cfg: Config, profile: DeviceProfile, n: int = 512, threads: int | None = None,
               variant="fused") -> float:
    """Prompt tokens/s of a prompt of n tokens (llama-bench pp n, at depth 0)."""
    return n / seconds(prefill_ops(cfg, n, variant), profile, threads)


@dataclass
class DecodePoint:
    n_prompt: int
    depth: int
    prefill: Timing      # seconds of the n_prompt-token pass
    step: Timing         # seconds of one generated token at `depth`

    @property
    def pp_tps(self) -> float:
        return self.n_prompt / self.prefill.median

    @property
    def tg_tps(self) -> float:
        return 1.0 / self.step.median


def measure_decode(model, n_prompt: int, depth: int, *, repeats: int = 5, warmup: int = 1,
                   clock: str = "wall", variant="fused", check=None) -> DecodePoint:
    """Prefill of n_prompt tokens and one decode step at `depth`, measured here with the one timer.
    Each timed step starts from the same cache of `depth` tokens (a shallow copy of its per-layer
    dicts: a step's torch.cat makes new tensors, so the copy's parent is untouched)."""
    cfg, net = model.cfg, model.net
    decode_ops(cfg, depth)  # the checks: causal, depth >= 0
    if n_prompt < 1 or depth + 1 > model.max_tokens or n_prompt > model.max_tokens:
        raise ValueError(f"n_prompt must lie in [1, {model.max_tokens}] and depth below {model.max_tokens}")
    v = parse_variant(variant)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (1, max(n_prompt, depth)), generator=g)

    def prefill():
        run = net.run_blocks(net.embed_text(ids[:, :n_prompt]), cache=[{} for _ in range(cfg.n_layers)], variants=v)
        return net.finish(run.x[:, -1:])

    with torch.inference_mode():
        pre = measure(prefill, repeats, warmup, clock=clock, check=check)
        cache = [{} for _ in range(cfg.n_layers)]
        if depth:
            net.run_blocks(net.embed_text(ids[:, :depth]), cache=cache, variants=v)
        token = net.embed_text(ids[:, :1], offset=depth)

        def step():
            run = net.run_blocks(token, cache=[dict(c) for c in cache], offset=depth, variants=v)
            return net.finish(run.x)

        tg = measure(step, repeats, warmup, clock=clock, check=check)
    return DecodePoint(n_prompt, depth, pre, tg)


def decode_rows(key: str, model, n_prompt: int, depths, *, profiles: dict, repeats: int = 3, warmup: int = 1,
                clock: str = "wall", measured: bool = True, pi_threads: int = 4, check=None) -> list[dict]:
    """CSV rows (latency.results schema, test pp / tg) for a causal LM: measured here (backend cpu)
    when `measured`, and modelled for each profile in `profiles` ({backend: DeviceProfile})."""
    cfg = model.cfg
    base = dict(model=key, variant="fused", n_heads=cfg.n_heads, repeats=repeats, warmup=warmup, clock=clock,
                n_prompt=int(n_prompt), seq_len=int(n_prompt))
    rows = []
    for backend, prof in profiles.items():  # modelled first: no deadline can drop them
        pp = predict_pp(cfg, prof, int(n_prompt), threads=pi_threads)
        rows.append(dict(base, backend=backend, measured=False, test="pp", depth=0, threads=pi_threads,
                         engine=prof.engine, dtype=prof.dtype, pp_tps=pp, median_ms=1e3 * n_prompt / pp))
        for d in depths:
            tg = predict_tg(cfg, prof, int(d), threads=pi_threads)
            rows.append(dict(base, backend=backend, measured=False, test="tg", depth=int(d), threads=pi_threads,
                             engine=prof.engine, dtype=prof.dtype, tg_tps=tg, median_ms=1e3 / tg))
    if measured:
        rows += measured_rows(key, model, n_prompt, depths, repeats=repeats, warmup=warmup, clock=clock, check=check)
    for r in rows:
        r.setdefault("p10_ms", r["median_ms"])
        r.setdefault("p90_ms", r["median_ms"])
    return rows


def measured_rows(key: str, model, n_prompt: int, depths, *, repeats: int = 3, warmup: int = 1,
                  clock: str = "wall", check=None):
    """The measured (backend cpu) rows of `decode_rows`, yielded depth by depth, so a deadline that
    stops a later depth keeps the earlier ones."""
    cfg = model.cfg
    base = dict(model=key, variant="fused", n_heads=cfg.n_heads, repeats=repeats, warmup=warmup, clock=clock,
                n_prompt=int(n_prompt), seq_len=int(n_prompt), backend="cpu", measured=True, engine="torch",
                dtype="fp32")
    for d in depths:
        point = measure_decode(model, int(n_prompt), int(d), repeats=repeats, warmup=warmup, clock=clock, check=check)
        threads = torch.get_num_threads()
        if d == depths[0]:
            yield dict(base, test="pp", depth=0, threads=threads, pp_tps=point.pp_tps,
                       median_ms=point.prefill.median_ms, p10_ms=point.prefill.p10_ms, p90_ms=point.prefill.p90_ms)
        yield dict(base, test="tg", depth=int(d), threads=threads, tg_tps=point.tg_tps,
                   median_ms=point.step.median_ms, p10_ms=point.step.p10_ms, p90_ms=point.step.p90_ms)


def decode_sweep(plan: SweepPlan, models: dict, depths: list[int], n_prompt: int = 128, *,
                 profiles: dict | None = None, deadline: Deadline | None = None,
                 own_process: bool = False) -> pd.DataFrame:
    """llama-bench's pp n_prompt and tg at each depth for every causal model of the plan: modelled on
    each Pi backend x engine x dtype at the first Pi thread count, measured here (backend cpu) with
    the per-call KV cache (at the plan's first thread count when `own_process`, else at this process's).
    A deadline stops the measured part, keeping the modelled rows."""
    profiles = dict(costmodel.PROFILES, **(profiles or {}))
    meta = dict(machine_metadata(), timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    rows, stopped = [], ""
    for key in plan.models:
        model = models[key]
        if not model.cfg.causal:
            continue
        chosen = {(b, e, d): engine_profile(profiles[b], e, d) for b in plan.backends if b in PI_BACKENDS
                  for e, d in plan.engine_pairs()}
        for (b, e, d), prof in chosen.items():
            rows += [dict(r, backend=b) for r in decode_rows(key, model, n_prompt, depths, profiles={b: prof},
                                                                 measured=False, pi_threads=plan.pi_threads[0])]
        if "cpu" in plan.backends and not stopped:
            try:  # the shallowest depth first, so a deadline keeps at least the cheap rows
                with thread_count(plan.threads[0]) if own_process else nullcontext():
                    for row in measured_rows(key, model, n_prompt, sorted(depths), repeats=plan.repeats,
                                             warmup=plan.warmup, clock=plan.clock,
                                             check=None if deadline is None else deadline.check):
                        rows.append(row)
            except (JobTimeout, JobCancelled) as err:
                stopped = f"{err}; the decode rows measured before it are kept"
    for r in rows:
        r.update(schema=SCHEMA, shape=config_spec(models[r["model"]].cfg), **meta)
    df = pd.DataFrame(rows).reindex(columns=COLUMNS)
    df["tokens_per_s"] = df["pp_tps"].fillna(df["tg_tps"])
    df.attrs["stopped"] = stopped
    return df
