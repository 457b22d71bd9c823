"""Translation cost against source length, split into encoding (once per sentence) and decoding
(per target token): measured here on an encoder-decoder of ours (en-pt, pt-en, a Marian / BART
folder), and modelled for a Raspberry Pi 4 / 5 with the cost model's device profiles.

`python -m attnviz.bench --model en-pt [--seq-lens 8,16,32,64] [--backend cpu,pi4,pi5]` writes one
CSV row per (model, backend, source length): encode_ms, decode_ms_per_token and sentence_ms (the
encoding plus as many decoding steps as source tokens: a translation about as long as its source).
"""
from __future__ import annotations

import sys

import pandas as pd
import torch

from attnviz.base.exports import csv_text
from attnviz.base.timing import measure
from attnviz.core.attention import SOFTMAX
from attnviz.core.seq2seq import Seq2SeqConfig
from attnviz.core.translator import Seq2SeqModel
from attnviz.latency.costmodel import F32, PROFILES, Op, gemm_op, layer_ops, op_seconds
from attnviz.latency.sweep import parse_int_list
from attnviz.weights.catalogue import BUNDLED, load_model

DECODE_STEPS = 16   # steps timed per measurement; the per-token figure is their mean
MAX_SOURCE = 1024   # source lengths beyond this are refused (the positions table of Bergamot)


def _norm(n: int, d: int) -> Op:
    return Op("layernorm", "other", "vector", 8 * n * d, 2 * F32 * n * d)


def _attend(name: str, h: int, S: int, dh: int) -> list[Op]:
    """One query row over S keys: scores, softmax, weighted sum (the explicit path: weights kept)."""
    return [Op(f"scores ({name})", "attention", "bmm", 2 * h * S * dh, F32 * h * S * (dh + 1), rows=1),
            Op(f"softmax ({name})", "attention", "vector", 12 * h * S, 2 * F32 * h * S, calls=2),
            Op(f"weights x V ({name})", "attention", "bmm", 2 * h * S * dh, F32 * h * S * (dh + 1), rows=1)]


def cross_heads_of(cfg: Seq2SeqConfig, cross_heads) -> tuple[int, ...]:
    """Each decoder layer's cross-attention head count: all of them, or what a pruned copy keeps."""
    heads = tuple(cross_heads) if cross_heads is not None else (cfg.n_heads,) * cfg.n_dec_layers
    if len(heads) != cfg.n_dec_layers or any(not 0 <= k <= cfg.n_heads for k in heads):
        raise ValueError(f"cross-attention heads kept must be {cfg.n_dec_layers} counts of 0..{cfg.n_heads}")
    return heads


def encode_ops(cfg: Seq2SeqConfig, n_src: int, cross_heads=None) -> list[tuple[Op, int]]:
    """(op, times) of encoding n_src tokens, the decoder layers' cross K/V projections included
    (narrower where `cross_heads` keeps fewer heads in a layer)."""
    d, h = cfg.d_model, cfg.n_heads
    ops = [(op, cfg.n_enc_layers) for op in layer_ops(cfg.block_config(), n_src, SOFTMAX, h, h)]
    return ops + [(gemm_op("cross K/V projection", "projections", n_src, d, 2 * k * cfg.d_head), 1)
                  for k in cross_heads_of(cfg, cross_heads) if k]


def step_ops(cfg: Seq2SeqConfig, n_src: int, depth: int, vocab: int | None = None,
             cross_heads=None) -> list[tuple[Op, int]]:
    """(op, times) of one decoding step at target position `depth`; `vocab`: pieces scored
    (default the whole vocabulary; a shortlist's size otherwise); `cross_heads`: each decoder
    layer's kept cross-attention heads (default all)."""
    d, h, dh, ff = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_ff
    kept = cross_heads_of(cfg, cross_heads)
    layer = []
    if cfg.decoder == "ssru":
        layer += [gemm_op("SSRU W", "projections", 1, d, d, bias=False), gemm_op("SSRU forget gate", "projections", 1, d, d),
                  Op("SSRU cell", "other", "vector", 6 * d, 10 * F32 * d, calls=6)]
    else:
        layer += [gemm_op("self Q", "projections", 1, d, d), gemm_op("self K/V", "projections", 1, d, 2 * d),
                  Op("cache append", "other", "vector", 0, 2 * F32 * (depth + 1) * d, calls=2)]
        layer += _attend("self", h, depth + 1, dh) + [gemm_op("self output", "projections", 1, d, d)]
    layer += [_norm(1, d)]
    after = [_norm(1, d), gemm_op("FFN in", "mlp", 1, d, ff), Op("activation", "mlp", "vector", 10 * ff, 2 * F32 * ff),
             gemm_op("FFN out", "mlp", 1, ff, d), _norm(1, d),
             Op("residual adds", "other", "vector", 3 * d, 9 * F32 * d, calls=3)]
    ops = [(op, cfg.n_dec_layers) for op in layer + after]
    for k in kept:  # cross-attention, as wide as the heads each layer keeps
        if k:
            ops += [(op, 1) for op in [gemm_op("cross Q", "projections", 1, d, k * dh)]
                    + _attend("cross", k, n_src, dh) + [gemm_op("cross output", "projections", 1, k * dh, d)]]
    ops.append((gemm_op("output logits", "projections", 1, d, vocab or cfg.vocab_size), 1))
    ops.append((Op("log-softmax, top-k", "other", "vector", 12 * (vocab or cfg.vocab_size),
                   3 * F32 * (vocab or cfg.vocab_size), calls=3), 1))
    return ops


def predict(cfg: Seq2SeqConfig, n_src: int, backend: str, threads: int | None = None, cross_heads=None) -> dict:
    """Modelled encode_ms and decode_ms_per_token (the mean over a translation as long as its source);
    `cross_heads`: each decoder layer's kept cross-attention heads (default all)."""
    profile = PROFILES[backend]
    p = profile.at_threads(threads) if threads else profile
    encode = sum(k * op_seconds(op, p) for op, k in encode_ops(cfg, n_src, cross_heads))
    steps = [sum(k * op_seconds(op, p) for op, k in step_ops(cfg, n_src, t, cross_heads=cross_heads))
             for t in range(n_src)]
    return dict(encode_ms=1e3 * encode, decode_ms_per_token=1e3 * sum(steps) / len(steps))


def measure_here(model: Seq2SeqModel, n_src: int, repeats: int = 5, warmup: int = 1) -> dict:
    """Measured on this CPU, cross-attention captured as the Translate page does: encode n_src
    random pieces (end of sentence last), then DECODE_STEPS steps from a fresh decoding state."""
    cfg, net = model.cfg, model.net
    g = torch.Generator().manual_seed(n_src)
    src = torch.randint(1, cfg.vocab_size, (1, n_src), generator=g)
    src[0, -1] = cfg.eos_id
    feed = torch.randint(1, cfg.vocab_size, (DECODE_STEPS, 1, 1), generator=g)
    feed[0] = cfg.decoder_start_id
    return time_encode_decode(net, src, feed, repeats, warmup)


def time_encode_decode(net, src: torch.Tensor, feed: torch.Tensor, repeats: int = 5, warmup: int = 1) -> dict:
    """Median encode_ms of `net.encode(src)` (weights captured) plus the decoder's cross K/V, and
    decode_ms_per_token of feeding
    `feed` (T, 1, 1) one token a step from a fresh decoding state: the translators' and Whisper's."""
    with torch.inference_mode():
        memory, _ = net.encode(src)
        # encoding includes the cross K/V (once per sentence), as `encode_ops` counts it
        encode = measure(lambda: net.start(net.encode(src, need_weights=True)[0]), repeats, warmup)
        begun = net.start(memory)

        def decode():
            state = begun.fresh()
            for ids in feed:
                net.step(ids, state, need_weights=True)
        steps = measure(decode, repeats, warmup)
    return dict(encode_ms=1e3 * encode.median, decode_ms_per_token=1e3 * steps.median / len(feed))


def sweep(models: dict, lengths: list[int], backends: list[str], repeats: int = 5,
          warmup: int = 1) -> pd.DataFrame:
    """models: key -> loaded model. One row per (model, source length, backend)."""
    rows, threads = [], torch.get_num_threads()
    for key, model in models.items():
        if not isinstance(model, Seq2SeqModel):
            raise ValueError(f"{key!r} is not a translation model; sweep translators and other models separately")
        for n in lengths:
            if not 2 <= n <= min(MAX_SOURCE, model.cfg.max_positions):
                raise ValueError(f"source lengths must lie in 2..{min(MAX_SOURCE, model.cfg.max_positions)}")
            for backend in backends:
                if backend == "cpu":
                    got = measure_here(model, n, repeats, warmup)
                elif backend in PROFILES:
                    got = predict(model.cfg, n, backend)
                else:
                    raise ValueError(f"backend {backend!r}: translation runs on cpu, pi4 or pi5")
                rows.append(dict(model=key, backend=backend, threads=threads if backend == "cpu" else
                                 PROFILES[backend].threads, source_tokens=n, **got,
                                 sentence_ms=got["encode_ms"] + n * got["decode_ms_per_token"]))
    return pd.DataFrame(rows)


def is_translator(key: str) -> bool:
    """A bundled translation key (the CLI sends these here)."""
    return BUNDLED.get(str(key).strip(), {}).get("task") == "translation"


def main(args, ap) -> int:
    """The CLI's translation branch: argparse's `args` (--model, --seq-lens, --backend, --threads,
    --repeats, --warmup, --out); errors go through `ap.error`."""
    try:
        lengths = parse_int_list(args.seq_lens, "--seq-lens")
        backends = [b.strip() for b in args.backend.split(",") if b.strip()] or ["cpu"]
        torch.set_num_threads(parse_int_list(args.threads, "--threads")[0])
        df = sweep({key: load_model(key) for key in args.model}, lengths, backends, args.repeats, args.warmup)
    except ValueError as err:
        ap.error(str(err))
    return write_csv(df, args.out, ap)


def write_csv(df: pd.DataFrame, out: str | None, ap=None) -> int:
    """The CSV (`exports.csv_text`) to the file `out`, or to stdout without one: the CLI's one
    writer. A write that fails (the disk filled during the sweep) is `ap.error`'s message."""
    text = csv_text(df)
    if not out:
        sys.stdout.write(text)
        return 0
    try:
        with open(out, "w", newline="") as f:  # the text holds its own CRLF row ends
            f.write(text)
    except OSError as err:
        if ap is None:
            raise
        ap.error(f"could not write {out!r}: {err.strerror or err}")
    sys.stderr.write(f"wrote {len(df)} rows to {out}\n")
    return 0
