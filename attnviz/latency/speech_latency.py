"""Whisper's cost, split as it runs: one encoding of a fixed 30 s window (1,500 audio frames after
the convolutions, however short the speech) and one decoding step per text token; measured here on
our Whisper (`attnviz.core.speech_model`) and modelled for a Raspberry Pi 4 / 5 per engine and dtype
(`latency.engines`: the Pi 5 and Pi 4 whisper.cpp encoder runs of `latency.published` are the
anchor of ggml fp16).

`python -m attnviz.bench --model whisper-tiny-en [--backend cpu,pi4,pi5] [--engine torch,ggml]
[--dtype fp32,fp16] [--pi-threads 4]` writes two rows per (model, backend, engine, dtype, threads):
phase `encode` (ms of one window) and phase `decode` (ms per token, the mean of DECODE_STEPS steps),
with the published figure beside a modelled encoding it matches.

The shapes are the translation models' (`latency.translation.encode_ops` / `step_ops`: Whisper is
an encoder-decoder of `core.seq2seq`), plus the audio front-end's two convolutions.
"""
from __future__ import annotations

import pandas as pd
import torch

from attnviz.core.speech_model import SpeechModel
from attnviz.latency.costmodel import F32, PROFILES, Op, op_seconds
from attnviz.latency.engines import DTYPES, check_engine, engine_dtypes, engine_profile
from attnviz.latency.published import RUNS, WHISPER_SHAPES, whisper_shape
from attnviz.latency.sweep import PI_CORES, parse_int_list
from attnviz.latency.translation_latency import DECODE_STEPS, encode_ops, step_ops, time_encode_decode, write_csv
from attnviz.weights.catalogue import BUNDLED, load_model

COLUMNS = ["model", "backend", "engine", "dtype", "threads", "phase", "frames", "tokens", "ms", "published_ms"]


def conv_ops(cfg) -> list[tuple[Op, int]]:
    """The audio front-end: conv1 (n_mels -> d, kernel 3) over 2N mel frames, conv2 (d -> d, kernel 3,
    stride 2) onto N frames, each a matrix product of its unfolded input (rows: output frames)."""
    n, d, m = cfg.n_audio_ctx, cfg.d_model, cfg.n_mels
    return [(Op("conv1", "projections", "gemm", 2 * 2 * n * 3 * m * d, F32 * (2 * n * 3 * m + 2 * n * d),
                rows=2 * n, weights=3 * m * d), 1),
            (Op("conv2", "projections", "gemm", 2 * n * 3 * d * d, F32 * (n * 3 * d + n * d), rows=n,
                weights=3 * d * d), 1),
            (Op("GELU, positions", "other", "vector", 20 * 3 * n * d, 5 * F32 * n * d, calls=3), 1)]


def predict(cfg, device: str, engine: str = "torch", dtype: str = "fp32", threads: int = PI_CORES) -> dict:
    """Modelled encode_ms of one window and decode_ms_per_token (the mean of DECODE_STEPS steps
    over the window's frames) on `device` (pi4 | pi5) as `engine` runs it in `dtype`."""
    if device not in PROFILES:
        raise ValueError(f"backend {device!r}: Whisper runs on cpu, pi4 or pi5")
    p = engine_profile(device, engine, dtype).at_threads(threads)
    n = cfg.n_audio_ctx
    encode = sum(k * op_seconds(op, p) for op, k in conv_ops(cfg) + encode_ops(cfg, n))
    steps = [sum(k * op_seconds(op, p) for op, k in step_ops(cfg, n, t)) for t in range(DECODE_STEPS)]
    return dict(encode_ms=1e3 * encode, decode_ms_per_token=1e3 * sum(steps) / len(steps))


def published_encode(cfg, device: str, engine: str, dtype: str, threads: int) -> float | None:
    """The published encoder run (ms) of this shape, device, engine, dtype and threads, if any."""
    size = next((s for s, shape in WHISPER_SHAPES.items()
                 if shape == (cfg.n_enc_layers, cfg.d_model, cfg.n_heads)), None)
    if size is None or cfg.n_audio_ctx != 1500:
        return None
    return next((r.published for r in RUNS if r.shape == whisper_shape(size) and r.device == device
                 and r.engine == engine and r.dtype == dtype and r.threads == threads), None)


def measure_here(model: SpeechModel, repeats: int = 5, warmup: int = 1) -> dict:
    """Measured on this CPU as the Speech page runs it: one window of features (silence does as well as
    speech: the encoder's work is fixed), then DECODE_STEPS steps with cross-attention captured."""
    cfg = model.cfg
    feats = torch.zeros(1, cfg.n_mels, 2 * cfg.n_audio_ctx)
    g = torch.Generator().manual_seed(0)
    feed = torch.randint(0, cfg.vocab_size, (DECODE_STEPS, 1, 1), generator=g)
    feed[0] = cfg.sot_id
    return time_encode_decode(model.net, feats, feed, repeats, warmup)


def sweep(models: dict, backends: list[str], engines=("torch",), dtypes=("fp32",), pi_threads=(PI_CORES,),
          repeats: int = 5, warmup: int = 1) -> pd.DataFrame:
    """models: key -> loaded SpeechModel. Two rows (encode, decode) per (model, backend, engine,
    dtype, threads): cpu is measured in torch fp32 at torch's threads; pi4 / pi5 are modelled at
    each engine's dtypes among `dtypes` and each of `pi_threads`."""
    for e in engines:
        check_engine(e, (engine_dtypes(e) or ("",))[0])  # an unknown engine: its message
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        raise ValueError(f"unknown dtype {unknown[0]!r}; choose from {', '.join(DTYPES)}")
    if not any(d in engine_dtypes(e) for e in engines for d in dtypes):
        raise ValueError(f"no engine asked runs {', '.join(dtypes)}: " +
                         "; ".join(f"{e} runs {', '.join(engine_dtypes(e))}" for e in engines))
    if any(not 1 <= t <= PI_CORES for t in pi_threads):
        raise ValueError(f"--pi-threads must lie in 1..{PI_CORES}: a Pi 4 / 5 has {PI_CORES} cores")
    rows = []
    for key, model in models.items():
        if not isinstance(model, SpeechModel):
            raise ValueError(f"{key!r} is not a speech model; sweep Whisper and other models separately")
        cfg = model.cfg
        for backend in backends:
            if backend == "cpu":
                runs = [("torch", "fp32", torch.get_num_threads(), measure_here(model, repeats, warmup), None)]
            elif backend in PROFILES:
                runs = [(e, d, t, predict(cfg, backend, e, d, t), published_encode(cfg, backend, e, d, t))
                        for e in engines for d in dtypes if d in engine_dtypes(e) for t in pi_threads]
            else:
                raise ValueError(f"backend {backend!r}: Whisper runs on cpu, pi4 or pi5")
            for engine, dtype, threads, got, published in runs:
                base = dict(model=key, backend=backend, engine=engine, dtype=dtype, threads=threads)
                rows.append(dict(base, phase="encode", frames=cfg.n_audio_ctx, tokens=0, ms=got["encode_ms"],
                                 published_ms=published))
                rows.append(dict(base, phase="decode", frames=cfg.n_audio_ctx, tokens=DECODE_STEPS,
                                 ms=got["decode_ms_per_token"], published_ms=None))
    return pd.DataFrame(rows, columns=COLUMNS)


def is_speech(key: str) -> bool:
    """A bundled speech key (the CLI sends these here)."""
    return BUNDLED.get(str(key).strip(), {}).get("task") == "speech"


def main(args, ap) -> int:
    """The CLI's speech branch: argparse's `args` (--model, --backend, --engine, --dtype,
    --pi-threads, --threads, --repeats, --warmup, --out); errors go through `ap.error`."""
    try:
        backends = [b.strip() for b in args.backend.split(",") if b.strip()] or ["cpu"]
        engines = [e.strip() for e in args.engine.split(",") if e.strip()] or ["torch"]
        dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()] or ["fp32"]
        torch.set_num_threads(parse_int_list(args.threads, "--threads")[0])
        df = sweep({key: load_model(key) for key in args.model}, backends, engines, dtypes,
                   parse_int_list(args.pi_threads, "--pi-threads"), args.repeats, args.warmup)
    except ValueError as err:
        ap.error(str(err))
    return write_csv(df, args.out, ap)
