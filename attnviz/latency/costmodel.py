"""A roofline cost model of one forward pass: FLOPs and bytes per operation, and device profiles
that turn them into time (the host's profile is calibrated by `latency.calibrate`).

time(op) = max(FLOPs / peak(kind, size), bytes / bandwidth) + first-touch cost of big fresh tensors
           + overhead x (aten calls)
summed over the ops that `op_counts` lists for a Config, a sequence length and an attention variant
(a block's ops once per run of identical layers, times their count: the cost does not grow with depth).
The op list follows OUR implementation (attnviz.core.transformer / attnviz.core.attention), op by op, so that the
model predicts what `python -m attnviz.bench` measures. Batch 1, float32, inference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from attnviz.core.attention import Variant, parse_variant, with_window
from attnviz.core.config import Config


GROUPS = ("attention", "projections", "mlp", "other")  # attention = scores, softmax, weighted sum
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest dynamic mmap threshold: bigger tensors are fresh pages every call
F32 = 4
MAX_FIGURE = 1e9     # of any figure of a profile: GFLOP/s, GB/s, MB, microseconds, rows, cores


@dataclass(frozen=True)
class Op:
    name: str
    group: str        # one of GROUPS
    kind: str         # gemm | bmm | sdpa | vector
    flops: float
    bytes: float      # bytes read + written
    rows: int = 0     # rows of a (batched) matmul: small ones run below peak
    fresh: float = 0  # bytes of the largest newly allocated output (first-touch page faults when big)
    calls: int = 1    # aten calls, each paying the per-op overhead
    weights: float = 0  # weight elements read (their bytes are the profile's dtype: fp32 4, fp16 2, int8 1)


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    gemm_gflops: float   # fp32 linear layers at large sizes, with `threads` threads
    bmm_gflops: float    # per-head batched matmuls (eager scores and weighted sum)
    sdpa_gflops: float   # the fused attention kernel
    vector_gflops: float  # elementwise maths (exp, erf, rsqrt) counted as in `model_ops`
    half_rows: float     # matmul rows at which throughput is half the peak (small n runs below peak)
    dram_gbs: float      # bytes read + written per second out of cache
    cache_gbs: float     # same for working sets inside the last-level cache
    cache_mb: float
    fault_gbs: float     # first touch of a freshly mapped tensor (page faults)
    overhead_us: float   # Python + dispatcher per aten call
    cores: int
    threads: int = 1     # the thread count the figures above hold for
    source: str = ""
    saturation: float = 0.06  # thread curve s(t) = t / (1 + a (t - 1)): a = 0 scales perfectly (Amdahl-like)
    weight_bytes: float = 4.0  # bytes per weight element: fp32 4, fp16/bf16 2, int8 1, q4_0 0.5625
    engine: str = "torch"      # what runs the model (latency.engines): torch, ncnn, ggml
    dtype: str = "fp32"

    def __post_init__(self):
        """Every figure finite and positive (half_rows may be 0): a profile fitted to absurd numbers
        (a CSV's 1e308 ms) is refused here rather than predicting inf for every later sweep."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("float", "int") and not (math.isfinite(value) and (value > 0 or (
                    f.name in ("half_rows", "saturation") and value == 0))):
                raise ValueError(f"device profile {self.name!r}: {f.name} must be a finite positive number; "
                                 f"got {value!r}")
            if f.type in ("float", "int") and value > MAX_FIGURE:
                raise ValueError(f"device profile {self.name!r}: {f.name} = {value:.3g} is beyond any device "
                                 f"(at most {MAX_FIGURE:.0e})")
        if self.saturation >= 1:
            raise ValueError(f"device profile {self.name!r}: saturation must lie in [0, 1); got {self.saturation!r}")

    def speedup(self, threads: int) -> float:
        """s(t) = t / (1 + a (t - 1)) over one thread, t capped at the cores: a saturating curve (a Pi 5
        with ncnn: x2.0 at 4 threads, HPL x2.6; a Pi 4 with ncnn: x3.5), per device and engine."""
        t = min(int(threads), self.cores)
        return t / (1 + self.saturation * (t - 1))

    def at_threads(self, threads: int) -> "DeviceProfile":
        """Compute scales with the thread curve `speedup`; bandwidth does not."""
        if threads < 1:
            raise ValueError("threads must be at least 1")
        f = self.speedup(threads) / self.speedup(self.threads)
        return replace(self, gemm_gflops=self.gemm_gflops * f, bmm_gflops=self.bmm_gflops * f,
                       sdpa_gflops=self.sdpa_gflops * f, vector_gflops=self.vector_gflops * f,
                       threads=threads)


# Published figures. HPL is float64; NEON holds twice as many float32 lanes, and PyTorch's gemm
# reaches less of the peak than tuned HPL: we take fp32 gemm = 1.5 x HPL (an assumption, which a
# real Pi's CSV recalibrates). Overheads and page-fault rates are estimates from single-core speed.
PI4 = DeviceProfile(
    name="pi4", gemm_gflops=1.5 * 11.9, bmm_gflops=1.2 * 11.9, sdpa_gflops=1.2 * 11.9, vector_gflops=3.0,
    half_rows=8, dram_gbs=5.5, cache_gbs=12.0, cache_mb=1.0, fault_gbs=1.5, overhead_us=25.0, cores=4,
    threads=4,
    # HPL 11.9 GFLOPS (4 x Cortex-A72): issue #6; 11.4 on the same A72 cores in a CM4,
    #   geerlingguy/top500-benchmark#33 (Pi 4 B run: #13).
    # STREAM copy 5.5 GB/s (read + write): sci-pi.org.uk/bench/stream.html. L2 1 MB shared.
    source="Raspberry Pi 4 B: HPL 11.9 GFLOPS, STREAM 5.5 GB/s (published; fp32 and overheads assumed)")
PI5 = DeviceProfile(
    name="pi5", gemm_gflops=1.5 * 30.2, bmm_gflops=1.2 * 30.2, sdpa_gflops=1.2 * 30.2, vector_gflops=8.0,
    half_rows=8, dram_gbs=12.0, cache_gbs=30.0, cache_mb=2.0, fault_gbs=3.0, overhead_us=10.0, cores=4,
    threads=4,
    # HPL 30.249 GFLOPS at 2.4 GHz (4 x Cortex-A76): geerlingguy/top500-benchmark#18.
    # tinymembench C copy ~6.2 GB/s copied = ~12 GB/s read + write: geerlingguy/sbc-reviews#21.
    # L2 512 KB per core + 2 MB shared L3.
    source="Raspberry Pi 5: HPL 30.2 GFLOPS, tinymembench copy 6.2 GB/s (published; fp32 and overheads assumed)")
# Before calibration (budget estimates only): a modest x86 core.
HOST_GUESS = DeviceProfile(
    name="cpu (uncalibrated guess)", gemm_gflops=60, bmm_gflops=50, sdpa_gflops=30, vector_gflops=10,
    half_rows=6, dram_gbs=10, cache_gbs=40, cache_mb=16, fault_gbs=2, overhead_us=8, cores=2, threads=1,
    source="a guess for budget estimates before calibration")
PROFILES = {"pi4": PI4, "pi5": PI5}


# ---------------------------------------------------------------- the ops of one forward pass
def _flash_keys(n: int, causal: bool) -> float:
    """Mean keys per query that torch's CPU flash kernel computes: it skips whole key blocks of
    512 above the diagonal only (query blocks 32/64/256), so causal saves little below ~1k tokens."""
    if not causal:
        return n
    q_split = 256 if n >= 768 else 64 if n >= 192 else 32
    kv_split = 512 if n >= 512 else n
    total = 0
    for m in range(0, n, q_split):
        rows = min(q_split, n - m)
        total += rows * min(n, math.ceil(min(m + q_split, n) / kv_split) * kv_split)
    return total / n


def _attention_ops(cfg: Config, n: int, h: int, kv: int, v: Variant) -> list[Op]:
    dh, causal = cfg.d_head, cfg.causal
    q_bytes, kv_bytes = F32 * n * h * dh, F32 * n * kv * dh
    io = 2 * q_bytes + 2 * kv_bytes  # read q, k, v, write out
    kind = v.kind
    if kind == "softmax" and v.fused:
        keys = _flash_keys(n, causal)
        return [Op("fused attention", "attention", "sdpa", 4 * h * n * keys * dh + 8 * h * n * keys, io, rows=n)]
    expand = [] if kv == h else [Op("expand K/V heads", "attention", "vector", 0, 4 * F32 * n * h * dh, calls=2)]
    if kind == "chunked":
        c, blocks = v.chunk, math.ceil(n / v.chunk)
        mask = [Op("block masks", "attention", "vector", 0, 3 * n * n + F32 * 2 * n * n, fresh=F32 * c * n,
                   calls=5 * blocks)] if causal else []
        return mask + [Op("chunked attention", "attention", "sdpa", 4 * h * n * n * dh + 8 * h * n * n,
                          io + blocks * 2 * kv_bytes, rows=min(c, n), calls=3 * blocks)]
    if kind == "local":
        w = v.window
        block = max(w, 32)
        pairs = 0
        for s in range(0, n, block):
            e = min(s + block, n)
            keys = e - max(0, s - w + 1) if causal else min(n, e + w - 1) - max(0, s - w + 1)
            pairs += (e - s) * keys
        blocks = math.ceil(n / block)
        return [Op("local masks", "attention", "vector", 0, 3 * pairs + F32 * pairs, calls=6 * blocks),
                Op("local attention", "attention", "sdpa", 4 * h * pairs * dh + 8 * h * pairs, io, rows=min(block, n),
                   calls=2 * blocks)]
    if kind == "linear":
        feat = Op("elu+1 feature maps", "attention", "vector", 4 * (q_bytes + kv_bytes) / F32,
                  4 * (q_bytes + h * n * dh * F32), calls=4)
        if not causal:
            return expand + [feat, Op("phi(K)^T V, phi(Q) (KV)", "attention", "bmm", 4 * h * n * dh * dh,
                                      3 * q_bytes, rows=dh, calls=2),
                             Op("normaliser", "attention", "vector", 3 * h * n * dh, 4 * q_bytes, calls=5)]
        c, blocks = 64, math.ceil(n / 64)
        return expand + [feat, Op("block-causal linear", "attention", "bmm",
                                  4 * h * n * min(c, n) * dh + 6 * h * n * dh * dh, 6 * q_bytes,
                                  rows=min(c, n), calls=5 * blocks),
                         Op("block normaliser", "attention", "vector", 6 * h * n * dh,
                            8 * q_bytes, calls=14 * blocks)]
    # explicit (T, S) paths: eager softmax, relu, topk
    sq = F32 * h * n * n
    ops = expand + [Op("scores QK^T", "attention", "bmm", 2 * h * n * n * dh, sq + q_bytes + kv_bytes,
                       rows=n, fresh=sq)]
    if causal:
        ops.append(Op("causal mask", "attention", "vector", 0, 4 * n * n + 2 * sq, calls=4))
    if kind == "relu":
        ops.append(Op("relu and normalise", "attention", "vector", 3 * h * n * n, 5 * sq, fresh=sq, calls=4))
    else:
        ops.append(Op("scale", "attention", "vector", h * n * n, 2 * sq))
        if kind == "topk":
            ops.append(Op("top-k", "attention", "vector", 8 * h * n * n, 4 * sq, calls=4))
        ops.append(Op("softmax", "attention", "vector", 12 * h * n * n, 2 * sq, fresh=sq,
                      calls=1 + 3 * causal))
    ops.append(Op("weights x V", "attention", "bmm", 2 * h * n * n * dh, sq + kv_bytes + q_bytes, rows=n))
    return ops


def gemm_op(name, group, n, d_in, d_out, bias=True) -> Op:
    """A linear layer on n rows: its weights are read once (bytes per element from the profile's dtype)."""
    return Op(name, group, "gemm", 2 * n * d_in * d_out + bias * n * d_out,
              F32 * (n * d_in + n * d_out), rows=n, fresh=F32 * n * d_out, weights=d_in * d_out)



def _norm(cfg: Config, n: int) -> Op:
    x = F32 * n * cfg.d_model
    if cfg.norm == "rmsnorm":  # ours: pow, mean, add, rsqrt, mul, mul
        return Op("rmsnorm", "other", "vector", 5 * n * cfg.d_model, 7 * x, calls=6)
    return Op("layernorm", "other", "vector", 8 * n * cfg.d_model, 2 * x)


def layer_ops(cfg: Config, n: int, v: Variant, h: int, kv: int, window: int = 0) -> list[Op]:
    """The ops of one transformer block with h query heads and kv K/V heads; `window`: the layer's
    own sliding window, run as the block runs it (`with_window`: the local path, O(n·w))."""
    d, dh, ff = cfg.d_model, cfg.d_head, cfg.d_ff
    x = F32 * n * d
    v = with_window(v, window, n, n)[0]
    ops = [_norm(cfg, n)] * (2 * cfg.output_norms)
    if cfg.pre_norm:
        ops.append(_norm(cfg, n))
    if h:
        ops.append(gemm_op("QKV projection", "projections", n, d, (h + 2 * kv) * dh, cfg.qkv_bias))
        ops.append(Op("split heads", "projections", "vector", 0, 0, calls=7))
        if cfg.positional == "rotary":
            qk = F32 * n * (h + kv) * dh
            # x cos, -x2, cat, x sin, + : ~4.5 fresh copies of q and k, freed in turn (first touch once big:
            # measured here 53 ms against 5 without it for SmolLM2's block at 7,296 tokens)
            ops.append(Op("rotary", "projections", "vector", 3 * qk / F32, 8 * qk, calls=12, fresh=4.5 * qk))
        ops += _attention_ops(cfg, n, h, kv, v)
        ops.append(Op("merge heads", "projections", "vector", 0, 2 * F32 * n * h * dh, calls=3))
    ops.append(gemm_op("output projection", "projections", n, h * dh, d, cfg.out_bias))
    width = 2 * ff if cfg.gated_mlp else ff
    rows = n * cfg.experts_per_token if cfg.n_experts else n   # a mixture of experts: k experts' rows per token
    if cfg.n_experts:
        ops.append(gemm_op("router", "mlp", n, d, cfg.n_experts, False))
    ops.append(gemm_op("MLP in", "mlp", rows, d, width, cfg.mlp_bias))
    act_calls, act_bytes = (3, 5 * F32 * rows * ff) if cfg.gated_mlp else (1, 2 * F32 * rows * ff)
    ops.append(Op("activation", "mlp", "vector", 10 * rows * ff, act_bytes, calls=act_calls,
                  fresh=F32 * rows * ff * cfg.gated_mlp))  # SwiGLU's act(gate) and x up are new tensors
    ops.append(gemm_op("MLP out", "mlp", rows, ff, d, cfg.mlp_bias))
    ops.append(Op("residual adds", "other", "vector", 2 * n * d, 6 * x, calls=2 + 2 * cfg.layer_scale))
    ops.append(_norm(cfg, n))
    if not cfg.pre_norm:
        ops.append(_norm(cfg, n))
    return ops


def layer_runs(cfg: Config) -> list[tuple[int, int, int, int]]:
    """(query heads, K/V heads, window, layers) for each run of consecutive identical layers: one
    run for an unpruned or uniformly pruned model without windows, whatever its depth."""
    if not cfg.head_dims and not cfg.kv_dims and not cfg.windows:
        return [(cfg.n_heads, cfg.n_kv_heads, 0, cfg.n_layers)]
    runs = []
    for i in range(cfg.n_layers):
        shape = (cfg.heads_in(i), cfg.kv_heads_in(i), cfg.window(i))
        if runs and runs[-1][:3] == shape:
            runs[-1] = (*shape, runs[-1][3] + 1)
        else:
            runs.append((*shape, 1))
    return runs


def op_counts(cfg: Config, n: int, variant: "str | Variant | None" = None) -> list[tuple[Op, int]]:
    """The ops of one forward pass as (op, how many times it runs), in execution order: the ops of
    a block are listed once per run of identical layers, so the cost does not grow with depth."""
    if n < 1:
        raise ValueError(f"sequence length must be at least 1; got {n}")
    if hasattr(cfg, "op_counts"):  # a shape of latency.shapes (an explicit FLOP count, a bottleneck)
        return cfg.op_counts(n, variant)
    v = parse_variant(variant)
    d = cfg.d_model
    x = F32 * n * d
    if cfg.is_vision:  # patch embedding: a stride-p convolution is a matmul over patches
        patch = cfg.n_channels * cfg.patch_size ** 2
        ops = [Op("patch embedding", "other", "gemm", 2 * n * patch * d, F32 * (patch * d + n * patch + n * d),
                  rows=n), Op("position embeddings", "other", "vector", 2 * n * d, 5 * x, calls=6)]
    else:
        ops = [Op("embeddings", "other", "vector", 2 * n * d, 5 * x, calls=3 + (cfg.type_vocab_size > 0))]
    if cfg.embedding_norm:
        ops.append(_norm(cfg, n))
    out = [(op, 1) for op in ops]
    for h, kv, window, layers in layer_runs(cfg):
        out += [(op, layers) for op in layer_ops(cfg, n, v, h, kv, window)]
    tail = []
    if cfg.final_norm:
        tail.append(_norm(cfg, n))
    if cfg.task == "lm" or cfg.mlm_head:
        tail.append(gemm_op("LM head", "other", n, d, cfg.vocab_size, cfg.mlm_head))
    return out + [(op, 1) for op in tail]


def model_ops(cfg: Config, n: int, variant: "str | Variant | None" = None) -> list[Op]:
    """Every op of one forward pass of `cfg` on n tokens (batch 1), in execution order (one entry per
    layer: for costs, `op_counts` lists each block once per run of identical layers)."""
    out = []
    for op, count in op_counts(cfg, n, variant):
        out += [op] * count
    return out


# ---------------------------------------------------------------- time
def _efficiency(rows: int, half: float) -> float:
    return rows / (rows + half) if rows else 1.0


def op_seconds(op: Op, p: DeviceProfile) -> float:
    peak = {"gemm": p.gemm_gflops, "bmm": p.bmm_gflops, "sdpa": p.sdpa_gflops}.get(op.kind, p.vector_gflops)
    if op.kind != "vector":
        peak *= _efficiency(op.rows, p.half_rows)
    moved = op.bytes + op.weights * p.weight_bytes
    bandwidth = p.cache_gbs if moved <= p.cache_mb * 1e6 else p.dram_gbs
    t = max(op.flops / (peak * 1e9), moved / (bandwidth * 1e9))
    if op.fresh > MMAP_THRESHOLD:
        t += op.fresh / (p.fault_gbs * 1e9)
    return t + op.calls * p.overhead_us * 1e-6


@dataclass
class Prediction:
    n: int
    total_ms: float
    by_group: dict[str, float]  # ms per group of GROUPS
    flops: float
    ops: list[tuple[Op, float]]  # (op, ms of all its runs): a block's ops once per run of identical layers

    @property
    def attention_share(self) -> float:
        return self.by_group["attention"] / self.total_ms if self.total_ms else 0.0


def predict(cfg: Config, n: int, profile: DeviceProfile, variant=None, threads: int | None = None) -> Prediction:
    p = profile.at_threads(threads) if threads else profile
    counted = op_counts(cfg, n, variant)
    timed = [(op, count * op_seconds(op, p) * 1e3) for op, count in counted]
    groups = {g: 0.0 for g in GROUPS}
    for op, ms in timed:
        groups[op.group] += ms
    flops = sum(count * op.flops for op, count in counted)
    return Prediction(n, sum(ms for _, ms in timed), groups, flops, timed)


def attention_crossover(cfg: Config, profile: DeviceProfile, variant=None, n_max: int = 1 << 16) -> int | None:
    """The smallest n at which attention (scores, softmax, weighted sum) takes at least half the
    time, or None below n_max (linear-cost variants may never get there)."""
    def share(n):
        return predict(cfg, n, profile, variant).attention_share
    lo, hi = 1, 2
    while share(hi) < 0.5:
        if hi >= n_max:
            return None
        lo, hi = hi, min(2 * hi, n_max)
    while hi - lo > max(1, lo // 64):  # bisect to ~1.5%
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if share(mid) >= 0.5 else (mid, hi)
    return hi


def speedup_bound(cfg: Config, n: int, kept_fraction: float, profile: DeviceProfile, variant=None) -> float:
    """Amdahl bound on the speed-up from pruning heads: only the per-head work (attention and the
    Q/K/V/output projections) shrinks, to `kept_fraction` of itself; the MLP and the rest stay."""
    if not 0 <= kept_fraction <= 1:
        raise ValueError("kept_fraction must lie in [0, 1]")
    pred = predict(cfg, n, profile, variant)
    per_head = (pred.by_group["attention"] + pred.by_group["projections"]) / pred.total_ms
    return 1.0 / (1.0 - per_head * (1.0 - kept_fraction))


# ---------------------------------------------------------------- memory
def weights_mb(cfg: Config) -> float:
    d, L = cfg.d_model, cfg.n_layers
    per_layer = d * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.d_head + cfg.n_heads * cfg.d_head * d
    per_layer += d * cfg.d_ff * (3 if cfg.gated_mlp else 2) * max(1, cfg.n_experts) + d * cfg.n_experts
    emb = cfg.vocab_size * d + cfg.max_positions * d * (cfg.positional == "learned")
    head = cfg.vocab_size * d * (cfg.task == "lm" and not cfg.tie_embeddings)
    return F32 * (L * per_layer + emb + head) / 2**20


def activation_mb(cfg: Config, n: int, variant=None) -> float:
    """Peak bytes allocated during one forward pass beyond the weights (what bench measures)."""
    v = parse_variant(variant)
    d, dh, ff = cfg.d_model, cfg.d_head, cfg.d_ff
    h, kv = cfg.n_heads, cfg.n_kv_heads
    stream = 3 * n * d                             # residual, normed copy, block output
    qkv = 2 * n * (h + 2 * kv) * dh                # fused projection and the split/rotated heads
    sq = h * n * n
    if v.kind == "softmax" and v.fused:
        att = 2 * n * h * dh + 3 * 64 * 512        # output and the kernel's per-thread blocks
    elif v.kind == "chunked":
        att = 2 * n * h * dh + h * v.chunk * n + (2 * v.chunk * n if cfg.causal else 0)
    elif v.kind == "local":
        block = max(v.window, 32)
        att = 2 * n * h * dh + 2 * block * min(n, block + 2 * v.window)
    elif v.kind == "linear":
        att = 4 * n * h * dh + h * (64 * 64 + dh * dh) * (2 if cfg.causal else 1)
    else:                                          # explicit weights: scores and softmax side by side
        att = 2 * sq + (n * n // 2 if cfg.causal else 0) + n * h * dh + (2 * n * h * dh if kv != h else 0)
    mlp = n * ff * (4 if cfg.gated_mlp else 2)
    logits = n * cfg.vocab_size if cfg.task == "lm" else 0
    return F32 * (stream + max(qkv + att, mlp, logits)) / 2**20
