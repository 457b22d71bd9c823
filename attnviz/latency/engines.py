"""Engines and dtypes: what runs the model on a device changes its time as much as the device does
(published Pi runs of one shape differ by up to 3x between PyTorch, ncnn and whisper.cpp).

Per (device, engine, dtype) an `EngineFit`: a work factor on the device's matrix-product peak
(`gemm`) and on everything else in attention (`attention`: batched products, softmax, scaling),
a per-call overhead (framework dispatch; it dominates small models in PyTorch), a saturating thread
curve s(t) = t / (1 + a (t - 1)), and the bytes per weight of the dtype. `engine_profile` applies
one to the device's `costmodel.DeviceProfile`; `predict(..., profile)` does the rest.

Each fit stands for the engine release its published runs ran (`release`, `years`; `releases()` lists
them, and the Latency page shows the list): engines get faster between releases (newer whisper.cpp
code can encode Whisper well below what the 2022 code behind the pi4 ggml fp16 fit predicts), so
`engine@YEAR` (e.g. `ggml@2024`) asks for the profile of that year's release and a year no
published run covers is refused rather than extrapolated. No published, citable 2025 Pi run has
been found yet to fit a 2025 ggml profile.

Every figure is fitted to published runs, listed with their sources in `latency.published`
(tests/test_costmodel.py checks each within ±25%). Sources:
  * HAT (Wang et al., ACL 2020), github.com/mit-han-lab/hardware-aware-transformers,
    latency_dataset/wmt14enfr_cpu_raspberrypi_all.csv and wmt14ende_cpu_raspberrypi_all.csv:
    2,000 PyTorch fp32 encoder latencies each on a Raspberry Pi 4 (30 tokens, batch 1, 4 threads)
    -> pi4/torch/fp32 (work factor and overhead).
  * ncnn benchmark tables, github.com/Tencent/ncnn benchmark/README.md, "Raspberry Pi 4 Model B"
    and "Raspberry Pi 5" (benchncnn, 4 and 1 threads): vision_transformer (ViT-B/32 at 384 x 384,
    benchmark/models/vision_transformer.param: 12 layers, d 768, 12 heads, 145 tokens)
    -> pi4/ncnn/fp32 and pi5/ncnn/fp16 (ncnn runs fp16 arithmetic on the A76, fp32 on the A72),
    and their thread curves (Pi 5: x2.0 from 1 to 4 threads; Pi 4: x3.5).
  * whisper.cpp bench results, github.com/ggml-org/whisper.cpp/issues/89: Raspberry Pi 5
    (BCM2712, NEON, 4 threads, commit 54c978c) encoder of tiny, base, small, medium;
    Raspberry Pi 4 (NEON, 4 threads, commit aa6adda) tiny.en, base.en -> pi5/ggml/fp16, pi4/ggml/fp16.
  * llama.cpp / llamafile on the Pi, "LLaMA Now Goes Faster on CPUs" (justine.lol, 2024-03-31):
    TinyLlama 1.1B f16 prompt and generation tokens/s on a Pi 5 (llamafile 0.6.2, then llama.cpp's
    kernels) and a Pi 4 (llama.cpp 2024-03-26) -> the decode (tg) side of ggml: weights streamed
    once per token at the device's bandwidth; TinyLlama 1.1B q8_0 with llama.cpp 2024-03-26 on a Pi 4
    (pp 10, tg 3 tokens/s) and a Pi 5 (pp 35, tg 9) -> pi4/ggml/q8_0, pi5/ggml/q8_0.
  * llama.cpp pull request 6928 ("llamafile : use 64-bit integers in sgemm",
    github.com/ggml-org/llama.cpp/pull/6928, 2024-04-28): Llama 2 7B Q4_0 on a Pi 5 8GB, prompt
    eval 8.10 tokens/s over 109 tokens (llama.cpp's default 4 threads) -> pi5/ggml/q4_0. Its decode
    (bandwidth from q8_0's fit) is checked against Llama 2 13B (ollama's llama2:13b, Q4_0) generating
    1.35 tokens/s on a Pi 5 16 GB with no tweaks (github.com/geerlingguy/ai-benchmarks/issues/7).
  * HPL by threads (geerlingguy/top500-benchmark#18, Pi 5: 30.2 GFLOPS at 4 threads; x2.6 over one
    thread as quoted in this project's notes) -> the Pi 5 thread curve of BLAS-backed PyTorch.
  * Ultralytics' Raspberry Pi guide, YOLOv8 edition (github.com/ultralytics/ultralytics
    docs/en/guides/raspberry-pi.md, "Raspberry Pi 5 vs Raspberry Pi 4 YOLOv8 Benchmarks", PyTorch rows,
    fp32, 640 px, the default 4 threads): YOLOv8n 1,068.42 / 508.61 ms and YOLOv8s 2,589.58 / 969.49 ms
    on a Pi 4 / Pi 5 -> pi5/torch/fp32. The two networks run the same 176 PyTorch kernels (counted
    here) and differ by 19.86 GFLOP, so the difference of their times is PyTorch's marginal cost of
    compute on each Pi, free of the harness's fixed per-image cost (~400 ms on a Pi 4, ~300 ms on a
    Pi 5: benchmark mode times 4 images with no CPU warm-up): 76.6 and 23.2 ms per GFLOP, a Pi 4 -> Pi 5
    speed-up of x3.30. pi5/torch/fp32 is the HAT Pi 4 fit with that speed-up: its work factor set so the
    same two networks' marginal costs keep the published ratio, its per-call overhead 522 / 3.30 us
    (convolutions are not our matrix products, so the ratio, not their absolute speed, is used; both
    Pis' marginal costs then come out 13% above the published ones, the Pi 4's from the HAT fit alone).
Cross-checks, not fitted (their harnesses are not our loop; figures in `python -m attnviz.bench --published`'s notes):
  * openai-whisper (PyTorch) tiny.en / base.en on 9 Common Voice clips, Pi 4 4 GB and Pi 5 4 / 8 / 16 GB
    (github.com/BotYue/Pi-Whisper-RSS25-Workshop, openai_latency_*.txt; the first clip, a warm-up,
    left out): with each clip's tokens, the torch fits predict the mean per clip +6% / +16% on the Pi 4,
    -6% / +5% on the Pi 5 4 GB and -31% / -19% (8 GB), -31% / -24% (16 GB): the Pi 5 boards
    themselves differ by 37%, and the harness adds ffmpeg, the mel and openai-whisper's logit filters.
  * faster-whisper (CTranslate2) int8 / float32 on the same clips and boards: 1.08-1.28x on the Pi 4,
    1.23-1.69x on the Pi 5; torch int8 here predicts 1.24-1.28x for the same two shapes (all eight
    within 25%; CTranslate2's int8, like torch's dynamic quantization, quantizes the linear layers).
  * ollama 0.1.41 on a Pi 5 4 GB (github.com/aidatatools/ollama-benchmark/pull/9): qwen:1.8b 6.62 and
    phi3:3.8b 3.58 tokens/s, where q4_0 predicts 10.9 and 4.6: that ollama's fixed cost per token
    (about 60-90 ms, the intercept of tokens/s against size) is not llama.cpp's (TinyLlama's q8_0
    tg above has none); qwen:1.8b on a Pi 4 2 GB (3.05 tokens/s) comes out +11% with pi4 q4_0.
Derived, with no published run that can calibrate them (each says so in `source`):
  * torch int8 (both Pis): the one published PyTorch int8 Pi run found, the tutorial "Real Time
    Inference on Raspberry Pi 4 and 5 (40 fps!)" (github.com/pytorch/tutorials
    intermediate_source/realtime_rpi.rst: quantized MobileNetV2, 26.4 ms on a Pi 4, ~41 fps on a
    Pi 5), is a TorchScript-fused qnnpack CNN with no fp32 run of the same network beside it: its
    per-call cost is not our eager loop's and its depthwise convolutions are not matrix products, so
    it cannot fix our int8 GEMM factor (fitting gemm and overhead to it would match it by
    construction and test nothing).
  * torch bf16 is not offered on a Pi: the Pi 4's A72 and the Pi 5's A76 have no bf16 arithmetic
    (torch would convert to fp32 around every product) and no run was published; bf16 is measured
    on this CPU where it has the instructions (`--dtype bf16` on the cpu rows).
  * ncnn int8 and ncnn fp32 on a Pi 5: ncnn's tables have int8 only for CNNs (resnet50_int8 196.65 ms
    Pi 4, 40.75 ms Pi 5, 4 threads), whose published FLOP counts overstate what Winograd convolution
    computes (ResNet-50 fp32 on the Pi 4 runs at ~2x the GFLOP/s of its ViT), so they give the int8 /
    fp32 RATIO of the same network (1.1-1.8x on a Pi 4, 1.0-1.2x on a Pi 5: INT8_GEMM below), not a
    transformer factor.
  * pi4/ggml/q4_0: the one Pi 4 q4_0 run found (llama.cpp issue 58, LLaMA 7B on a 4 GB Pi 4, ~10 s a
    token) was swapping a 4 GB model through 4 GB of RAM: derived from pi4/ggml/q8_0 (same kernels).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from attnviz.latency.costmodel import PROFILES, DeviceProfile

ENGINES = {"torch": "PyTorch eager (this project's code)", "ncnn": "ncnn-like (fused kernels, packed layouts)",
           "ggml": "ggml-like (whisper.cpp / llama.cpp)"}
NO_BF16 = ("the Pi's Cortex-A72 / A76 have no bf16 arithmetic; bf16 is measured on this CPU's rows "
           "where it has the instructions")
DTYPES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
MEASURED_DTYPES = ("fp32", "int8", "bf16")  # what torch's timed rows run in (its own int8; bf16 where the CPU has it)
ENGINE_DTYPES = {"torch": ("fp32", "int8"), "ncnn": ("fp32", "fp16", "int8"),
                 "ggml": ("fp16", "q8_0", "q4_0")}


@dataclass(frozen=True)
class EngineFit:
    gemm: float          # x the device profile's matrix-product throughput
    attention: float     # x its batched-product, fused-attention and vector throughput
    overhead_us: float   # per kernel / framework call
    saturation: float    # a of s(t) = t / (1 + a (t - 1))
    bandwidth: float = 1.0  # x the device's bandwidth (decode streams the weights)
    half_rows: float | None = None  # matrix rows at half speed (None: the device's); ggml's matrix-vector
    source: str = ""                # kernels stream weights at one row, so decode is bandwidth-bound
    release: str = ""               # the engine code its published runs ran (what the profile stands for)
    years: tuple[int, int] | None = None  # the releases' years, for `engine@YEAR` (None: runs not dated)


# Fitted (least squares on relative error) to the runs of `latency.published`; see the docstring.
FITS: dict[tuple[str, str, str], EngineFit] = {
    ("pi4", "torch", "fp32"): EngineFit(0.665, 0.665, 522.0, 0.050, source="HAT Pi 4 latency dataset (PyTorch)",
                                         release="PyTorch as HAT's latency dataset ran it (2020)",
                                         years=(2020, 2020)),
    # the HAT Pi 4 fit times the published Pi 4 -> Pi 5 speed-up of PyTorch (Ultralytics' YOLOv8n / s: x3.30 in
    # marginal cost per GFLOP), on the Pi 5's profile with HPL's thread curve (see the docstring)
    ("pi5", "torch", "fp32"): EngineFit(
        0.865, 0.865, 158.0, 0.179,
        source="HAT Pi 4 fit x Ultralytics YOLOv8 PyTorch Pi 4 -> Pi 5 speed-up; HPL threads",
        release="PyTorch as HAT (2020) and Ultralytics' YOLOv8 Raspberry Pi guide ran it"),
    ("pi4", "ncnn", "fp32"): EngineFit(0.823, 0.823, 5.0, 0.050, source="ncnn benchmark, Raspberry Pi 4",
                                       release="ncnn as its benchmark tables ran it"),
    ("pi5", "ncnn", "fp16"): EngineFit(1.016, 1.016, 5.0, 0.315, source="ncnn benchmark, Raspberry Pi 5",
                                       release="ncnn as its benchmark tables ran it"),
    ("pi4", "ggml", "fp16"): EngineFit(0.362, 0.184, 5.0, 0.050, half_rows=0.5,
                                       source="whisper.cpp #89 Pi 4; TinyLlama f16 Pi 4 (llama.cpp)",
                                       release="whisper.cpp aa6adda (2022), llama.cpp 2024-03-26", years=(2022, 2024)),
    ("pi5", "ggml", "fp16"): EngineFit(1.508, 0.788, 5.0, 0.179, bandwidth=0.889, half_rows=0.5,
                                       source="whisper.cpp #89 Pi 5; TinyLlama f16 Pi 5 (llamafile 0.6.2)",
                                       release="whisper.cpp 54c978c (2023), llamafile 0.6.2 (2024)",
                                       years=(2023, 2024)),
    # q8_0 weight blocks (the attention stays f16 / f32 in ggml): fitted to TinyLlama q8_0 pp and tg with
    # llama.cpp 2024-03-26; the A72 has no fp16 arithmetic, so q8_0 runs its products ~6x faster than f16
    ("pi4", "ggml", "q8_0"): EngineFit(2.12, 0.184, 5.0, 0.050, bandwidth=0.62, half_rows=0.5,
                                       source="TinyLlama q8_0 Pi 4 (llama.cpp 2024-03-26)",
                                       release="llama.cpp 2024-03-26", years=(2024, 2024)),
    ("pi5", "ggml", "q8_0"): EngineFit(1.84, 0.788, 5.0, 0.179, bandwidth=0.87, half_rows=0.5,
                                       source="TinyLlama q8_0 Pi 5 (llama.cpp 2024-03-26)",
                                       release="llama.cpp 2024-03-26", years=(2024, 2024)),
    # q4_0 prompt processing (llamafile's sgemm in llama.cpp); decode keeps q8_0's bandwidth (checked: Llama 2 13B tg)
    ("pi5", "ggml", "q4_0"): EngineFit(2.43, 0.788, 5.0, 0.179, bandwidth=0.87, half_rows=0.5,
                                       source="Llama 2 7B Q4_0 pp Pi 5 (llama.cpp #6928)",
                                       release="llama.cpp with llamafile's sgemm (2024-04-28)", years=(2024, 2024)),
}
# Derived entries: the same engine with another dtype (weights' bytes from DTYPES; compute as said).
INT8_GEMM = 1.6   # torch int8 dynamic vs fp32 matrix products; ncnn's own tables: mobilenet 61 -> 34 ms (Pi 4)
# ncnn fp32 on a Pi 5 from its fp16 fit: 0.7 x (fp16 NEON holds twice the lanes; ncnn gains ~1.4x in practice, an assumption)
DERIVED = {("torch", "int8"): ("torch", "fp32", INT8_GEMM),
           ("ncnn", "int8"): ("ncnn", "fp32", INT8_GEMM), ("ncnn", "fp32"): ("ncnn", "fp16", 0.7),
           ("ncnn", "fp16"): ("ncnn", "fp32", 1.0), ("ggml", "q8_0"): ("ggml", "fp16", 1.0),
           ("ggml", "q4_0"): ("ggml", "q8_0", 1.0)}  # pi4 q4_0 (see the docstring)


def split_engine(spec: str) -> tuple[str, int | None]:
    """"ggml@2024" -> ("ggml", 2024); "ggml" -> ("ggml", None): an engine, and the year of the
    release whose published runs its profile must come from."""
    engine, at, year = str(spec).partition("@")
    if not at:
        return engine, None
    if not year.strip().isdigit():
        raise ValueError(f"{spec!r}: give the engine's release year after @, e.g. {engine}@2024")
    return engine, int(year)


def engine_dtypes(spec: str) -> tuple[str, ...]:
    """The dtypes this engine (`name` or `name@YEAR`) runs on a Pi; () for an unknown one."""
    return ENGINE_DTYPES.get(split_engine(spec)[0], ())


def check_engine(engine: str, dtype: str, measured: bool = False):
    """ValueError unless this engine runs this dtype on a Pi (`measured`: a timed row, where torch
    also runs bf16 if the CPU has it)."""
    engine = split_engine(engine)[0]
    if measured and engine == "torch" and dtype in MEASURED_DTYPES:
        return
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    if dtype not in ENGINE_DTYPES[engine]:
        raise ValueError(f"{engine} does not run {dtype!r} on a Pi; it runs {', '.join(ENGINE_DTYPES[engine])}"
                         + (f" ({NO_BF16})" if dtype == "bf16" else ""))


def engine_fit(device: str, engine: str, dtype: str) -> EngineFit:
    """The fit for this device, engine and dtype: a published one, or one derived from it (see DERIVED).
    `engine@YEAR` asks for the profile of that year's release: the one fit when its published runs
    cover the year, else a ValueError saying which release the profile models (engines change
    between releases, and no run of that year is here to say by how much)."""
    engine, year = split_engine(engine)
    fit = _fit(device, engine, dtype)
    if year is not None and (fit.years is None or not fit.years[0] <= year <= fit.years[1]):
        covered = f"; choose {engine}@{fit.years[0]}..{fit.years[1]} or plain {engine}" if fit.years else ""
        raise ValueError(f"no published Raspberry Pi runs of {engine} from {year} calibrate {device} {engine} "
                         f"{dtype}: that profile models {fit.release or 'undated runs'}{covered}")
    return fit


def _fit(device: str, engine: str, dtype: str) -> EngineFit:
    check_engine(engine, dtype)
    if (device, engine, dtype) in FITS:
        return FITS[(device, engine, dtype)]
    base_engine, base_dtype, factor = DERIVED[(engine, dtype)]
    if (device, base_engine, base_dtype) in FITS or (base_engine, base_dtype) in DERIVED:
        base = _fit(device, base_engine, base_dtype)  # at most two steps: int8 <- fp32 <- fp16
    else:
        raise ValueError(f"no published runs calibrate {engine} {dtype} on {device}")
    return replace(base, gemm=base.gemm * factor, source=f"{base.source}; {dtype} derived ({factor:g} x matrix speed)")


def engine_profile(device: "str | DeviceProfile", engine: str = "torch", dtype: str = "fp32") -> DeviceProfile:
    """The device's profile as this engine and dtype run on it (the published Pi profiles, or a
    recalibrated one passed in: its name says which device)."""
    base = PROFILES[device] if isinstance(device, str) else device
    key = base.name.split(" ")[0]
    if key not in PROFILES:
        raise ValueError(f"engines are calibrated for {', '.join(PROFILES)}; {base.name!r} is not one of them")
    fit = engine_fit(key, engine, dtype)
    return replace(base, name=f"{key} {engine} {dtype}", gemm_gflops=base.gemm_gflops * fit.gemm,
                   bmm_gflops=base.bmm_gflops * fit.attention, sdpa_gflops=base.sdpa_gflops * fit.attention,
                   vector_gflops=base.vector_gflops * fit.attention, dram_gbs=base.dram_gbs * fit.bandwidth,
                   overhead_us=fit.overhead_us, half_rows=base.half_rows if fit.half_rows is None else fit.half_rows, saturation=fit.saturation, weight_bytes=DTYPES[dtype],
                   engine=engine, dtype=dtype, source=f"{base.source}; {engine} {dtype}: {fit.source}")


def releases() -> list[dict]:
    """Which engine release each Pi profile (device x engine x dtype) models, from its fit's runs."""
    out = []
    for device in PROFILES:
        for engine, dtypes in ENGINE_DTYPES.items():
            for dtype in dtypes:
                fit = _fit(device, engine, dtype)
                out.append(dict(device=device, engine=engine, dtype=dtype, release=fit.release,
                                years="" if fit.years is None else "–".join(dict.fromkeys(map(str, fit.years))),
                                derived=(device, engine, dtype) not in FITS))
    return out
