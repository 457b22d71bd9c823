"""Published Raspberry Pi runs that calibrate `latency.engines` (each source is cited there and in
the README), and the cost model's prediction of each: tests/test_costmodel.py holds every one
within ±25%. A run is a forward pass (ms), a prompt (pp, tokens/s), generation (tg, tokens/s), or
the marginal cost of compute (ms_per_gflop): the difference of two networks' times over the
difference of their FLOPs, for two networks that run the same number of kernels, so that a harness's
fixed per-call and per-image costs cancel.

Shapes: HAT's SubTransformer encoders (fairseq, 30 tokens, Q/K/V width 512 whatever the heads;
"avg" FFN widths are exact for cost: the FFN is linear in its width), ncnn's ViT-B/32 at 384 x 384
(145 tokens), Whisper's encoders (1,500 frames after the convolutions, which are left out: about
4% of tiny's work), TinyLlama 1.1B (22 layers, d 2048, 32 heads, 4 K/V heads, FFN 5632), Llama 2 7B
(32 layers, d 4096, 32 heads, FFN 11008), Llama 2 13B (40 layers, d 5120, 40 heads, FFN 13824),
YOLOv8n / YOLOv8s at 640 x 640 as explicit FLOP counts (8.744 / 28.603 GFLOP, 3.152 / 11.157 M
weights, 176 PyTorch kernels each: counted here with torch's FlopCounterMode and a dispatch counter
on the networks Ultralytics builds from its yolov8n / yolov8s configs, and equal to its published
8.7 / 28.6 GFLOPs).
"""
from __future__ import annotations

from dataclasses import dataclass

from attnviz.latency import decode
from attnviz.latency.costmodel import predict
from attnviz.latency.engines import engine_profile
from attnviz.latency.shapes import parse_shape

HAT = ("github.com/mit-han-lab/hardware-aware-transformers latency_dataset/"
       "wmt14{}_cpu_raspberrypi_all.csv row {} (latency_mean_encoder)")
NCNN = "github.com/Tencent/ncnn benchmark/README.md, {} (benchncnn, vision_transformer avg)"
WHISPER = "github.com/ggml-org/whisper.cpp/issues/89 ({}, bench Encode)"
LLAMAFILE = "justine.lol/matmul 'LLaMA Now Goes Faster on CPUs' ({}, TinyLlama 1.1B f16)"
LLAMAFILE_Q8 = "justine.lol/matmul 'LLaMA Now Goes Faster on CPUs' ({}, TinyLlama 1.1B q8_0)"
ULTRALYTICS = ("github.com/ultralytics/ultralytics docs/en/guides/raspberry-pi.md, YOLOv8 edition ('Raspberry Pi 5 "
               "vs Raspberry Pi 4 YOLOv8 Benchmarks', PyTorch, FP32, 640): {}")
OLLAMA_13B = ("github.com/geerlingguy/ai-benchmarks/issues/7 (Pi 5 16 GB, ollama, 'Test 2 - No Tweaks', "
              "llama2:13b = Llama 2 13B Q4_0)")
SGEMM_PR = ("github.com/ggml-org/llama.cpp/pull/6928 'llamafile : use 64-bit integers in sgemm' (RasPi 5 8GB, "
            "Llama 2 7B Q4_0, llamafile enabled, prompt eval)")


def hat_shape(d: int, ff: float) -> str:
    return f"synthetic:family=bert,layers=6,d={d},heads=8,dh=64,ff={round(ff)},vocab=32768,positions=1024"


VIT_B32 = "synthetic:family=vit,layers=12,d=768,heads=12,ff=3072"
WHISPER_SHAPES = {  # encoder: (layers, d, heads)
    "tiny": (4, 384, 6), "base": (6, 512, 8), "small": (12, 768, 12), "medium": (24, 1024, 16)}
TINYLLAMA = "synthetic:family=llama,layers=22,d=2048,heads=32,kv=4,ff=5632,vocab=32000,positions=2048,causal=1"
LLAMA2_7B = "synthetic:family=llama,layers=32,d=4096,heads=32,ff=11008,vocab=32000,positions=4096,causal=1"
LLAMA2_13B = "synthetic:family=llama,layers=40,d=5120,heads=40,ff=13824,vocab=32000,positions=4096,causal=1"
YOLOV8N_GFLOP, YOLOV8S_GFLOP = 8.744, 28.603
YOLOV8N = f"synthetic:gflops={YOLOV8N_GFLOP},mparams=3.152,calls=176"
YOLOV8S = f"synthetic:gflops={YOLOV8S_GFLOP},mparams=11.157,calls=176"


def whisper_shape(size: str) -> str:
    layers, d, heads = WHISPER_SHAPES[size]
    return f"synthetic:family=gpt2,layers={layers},d={d},heads={heads},ff={4 * d},vocab=1,positions=1500,causal=0"


@dataclass(frozen=True)
class Run:
    source: str
    device: str       # pi4 | pi5
    engine: str
    dtype: str
    shape: str        # a synthetic spec (latency.shapes)
    n: int            # tokens of the pass / prompt (pp); depth for tg
    threads: int
    metric: str       # ms | pp_tps | tg_tps | ms_per_gflop
    published: float
    variant: str = "eager"  # every engine here computes the attention weights explicitly
    shape2: str = ""  # ms_per_gflop: the bigger network (same kernel count as `shape`)
    role: str = "fit"  # fit: a factor is fitted to it; check: predicted by factors fitted to other runs

    @property
    def label(self) -> str:
        return f"{self.device} {self.engine} {self.dtype} {self.metric} n={self.n} t={self.threads}"


RUNS: list[Run] = [
    *[Run(HAT.format("enfr", i), "pi4", "torch", "fp32", hat_shape(d, ff), 30, 4, "ms", ms) for i, d, ff, ms in (
        (1981, 512, 597.33, 141.19), (334, 512, 1365.33, 172.35), (1115, 512, 1536.0, 174.98),
        (1612, 640, 1792.0, 230.20), (1756, 512, 2048.0, 196.10), (262, 640, 2730.67, 260.14))],
    *[Run(HAT.format("ende", i), "pi4", "torch", "fp32", hat_shape(d, ff), 30, 4, "ms", ms) for i, d, ff, ms in (
        (576, 640, 512.0, 153.66), (712, 512, 1280.0, 170.39), (443, 640, 1536.0, 205.06),
        (1021, 512, 1792.0, 198.07), (857, 640, 1962.67, 219.91), (1526, 512, 2901.33, 236.08))],
    Run(NCNN.format("Raspberry Pi 4 Model B, 4 threads"), "pi4", "ncnn", "fp32", VIT_B32, 145, 4, "ms", 1909.21),
    Run(NCNN.format("Raspberry Pi 4 Model B, 1 thread"), "pi4", "ncnn", "fp32", VIT_B32, 145, 1, "ms", 6605.73),
    Run(NCNN.format("Raspberry Pi 5, 4 threads"), "pi5", "ncnn", "fp16", VIT_B32, 145, 4, "ms", 611.65),
    Run(NCNN.format("Raspberry Pi 5, 1 thread"), "pi5", "ncnn", "fp16", VIT_B32, 145, 1, "ms", 1250.30),
    *[Run(WHISPER.format(f"Pi 5 BCM2712, {size}"), "pi5", "ggml", "fp16", whisper_shape(size), 1500, 4, "ms", ms)
      for size, ms in (("tiny", 1106.11), ("base", 2479.82), ("small", 8308.3), ("medium", 26407.77))],
    *[Run(WHISPER.format(f"Raspberry Pi 4, {size}.en"), "pi4", "ggml", "fp16", whisper_shape(size), 1500, 4, "ms",
          ms) for size, ms in (("tiny", 9486.0), ("base", 25402.0))],
    Run(LLAMAFILE.format("RPI5, llamafile-0.6.2"), "pi5", "ggml", "fp16", TINYLLAMA, 0, 4, "tg_tps", 5.0),
    Run(LLAMAFILE.format("RPI4, llama.cpp 2024-03-26"), "pi4", "ggml", "fp16", TINYLLAMA, 0, 4, "tg_tps", 2.0),
    Run(LLAMAFILE.format("RPI4, llama.cpp 2024-03-26"), "pi4", "ggml", "fp16", TINYLLAMA, 512, 4, "pp_tps", 3.0),
    # the same table's q8_0 rows (llama.cpp 2024-03-26: prompt and generation tokens/s)
    *[Run(LLAMAFILE_Q8.format(f"{pi}, llama.cpp 2024-03-26"), device, "ggml", "q8_0", TINYLLAMA, n, 4, metric, tps)
      for pi, device, n, metric, tps in (("RPI5", "pi5", 512, "pp_tps", 35.0), ("RPI5", "pi5", 0, "tg_tps", 9.0),
                                         ("RPI4", "pi4", 512, "pp_tps", 10.0), ("RPI4", "pi4", 0, "tg_tps", 3.0))],
    Run(SGEMM_PR, "pi5", "ggml", "q4_0", LLAMA2_7B, 109, 4, "pp_tps", 8.10),
    # ollama's eval rate over a few hundred generated tokens after a short prompt: depth ~256 assumed
    Run(OLLAMA_13B, "pi5", "ggml", "q4_0", LLAMA2_13B, 256, 4, "tg_tps", 1.35, role="check"),
    # PyTorch on both Pis, one harness: (YOLOv8s - YOLOv8n) ms over their difference in GFLOP
    *[Run(ULTRALYTICS.format(f"YOLOv8n {n_ms} ms, YOLOv8s {s_ms} ms on RPi{device[-1]}"), device, "torch", "fp32",
          YOLOV8N, 1, 4, "ms_per_gflop", (s_ms - n_ms) / (YOLOV8S_GFLOP - YOLOV8N_GFLOP), shape2=YOLOV8S, role=role)
      for device, n_ms, s_ms, role in (("pi4", 1068.42, 2589.58, "check"),
                                       ("pi5", 508.61, 969.49, "fit (its ratio to the Pi 4's)"))],
]


def predicted(run: Run, profile=None) -> float:
    """The cost model's figure for this run, in the run's unit (ms or tokens/s)."""
    prof = profile or engine_profile(run.device, run.engine, run.dtype)
    shape = parse_shape(run.shape)
    if run.metric == "ms":
        return predict(shape, run.n, prof, run.variant, threads=run.threads).total_ms
    if run.metric == "pp_tps":
        return decode.predict_pp(shape, prof, run.n, threads=run.threads, variant=run.variant)
    if run.metric == "tg_tps":
        return decode.predict_tg(shape, prof, run.n, threads=run.threads)
    if run.metric == "ms_per_gflop":
        big = parse_shape(run.shape2)
        if getattr(big, "calls", None) != getattr(shape, "calls", None):
            raise ValueError("a marginal cost needs two networks with the same kernel count")
        ms = [predict(s, run.n, prof, run.variant, threads=run.threads).total_ms for s in (shape, big)]
        return (ms[1] - ms[0]) / (big.gflops - shape.gflops)
    raise ValueError(f"unknown metric {run.metric!r}: ms, pp_tps, tg_tps or ms_per_gflop")


def table() -> list[dict]:
    """Every run with its prediction and error (what the README and `--published` print)."""
    out = []
    for r in RUNS:
        p = predicted(r)
        out.append(dict(role=r.role, source=r.source, device=r.device, engine=r.engine, dtype=r.dtype,
                        shape=r.shape, n=r.n, threads=r.threads, metric=r.metric, published=r.published, predicted=p,
                        error_pct=100 * (p / r.published - 1)))
    return out
