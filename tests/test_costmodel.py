"""The cost model: it grows with n and heads, attention is quadratic where it should be, profiles
and recalibration behave, memory and weight estimates match the modules; the fit and crossover."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from attnviz.latency import calibrate, compare, decode, engines, published, shapes, sweep
from attnviz.figures.calibration_figures import BAND, calibration_figure
from attnviz.latency import costmodel
from attnviz.weights.catalogue import random_model
from attnviz.latency.results import parse_synthetic, with_heads

MINILM = parse_synthetic("synthetic:layers=6,d=384,heads=12,ff=1536,vocab=30522,positions=512")
SMOLLM2 = parse_synthetic("synthetic:family=llama,layers=30,d=576,heads=9,kv=3,dh=64,ff=1536,vocab=49152")
PROFILES = [costmodel.PI4, costmodel.PI5, costmodel.HOST_GUESS]
NS = [16, 32, 64, 128, 256, 512, 1024, 2048]


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
@pytest.mark.parametrize("variant", ["fused", "eager", "chunked:128", "local:64", "linear", "relu"])
@pytest.mark.parametrize("cfg", [MINILM, SMOLLM2], ids=["minilm", "smollm2"])
def test_latency_grows_with_n(profile, variant, cfg):
    times = [costmodel.predict(cfg, n, profile, variant).total_ms for n in NS]
    assert all(b > a for a, b in zip(times, times[1:]))


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
@pytest.mark.parametrize("variant", ["fused", "eager", "linear"])
def test_latency_grows_with_heads(profile, variant):
    cfg = parse_synthetic("synthetic:layers=4,d=256,heads=8,dh=32,ff=1024")
    times = [costmodel.predict(with_heads(cfg, k), 512, profile, variant).total_ms for k in (1, 2, 4, 8)]
    assert all(b > a for a, b in zip(times, times[1:]))
    # heads of their own width (fixed d_head) add work; more heads in the same d_model do not shrink it
    wide = [costmodel.predict(parse_synthetic(f"synthetic:layers=4,d=256,heads={h},dh=32,ff=1024"), 512, profile,
                       variant).total_ms for h in (4, 8)]
    assert wide[1] > wide[0]


def test_attention_work_is_quadratic_unless_linear():
    def attention_flops(variant, n):
        return sum(op.flops for op in costmodel.model_ops(MINILM, n, variant) if op.group == "attention")
    for variant in ("eager", "fused", "chunked:64", "relu"):
        assert attention_flops(variant, 2048) / attention_flops(variant, 1024) == pytest.approx(4, rel=0.01)
    assert attention_flops("linear", 2048) / attention_flops("linear", 1024) == pytest.approx(2, rel=0.01)
    assert attention_flops("local:64", 4096) / attention_flops("local:64", 2048) == pytest.approx(2, rel=0.05)
    mlp = [sum(op.flops for op in costmodel.model_ops(MINILM, n) if op.group == "mlp") for n in (1024, 2048)]
    assert mlp[1] / mlp[0] == pytest.approx(2, rel=0.01)


def test_groups_add_up_to_the_total_and_every_op_costs_something():
    pred = costmodel.predict(SMOLLM2, 256, costmodel.PI4, "eager")
    assert sum(pred.by_group.values()) == pytest.approx(pred.total_ms)
    assert set(pred.by_group) == set(costmodel.GROUPS) and all(ms > 0 for _, ms in pred.ops)
    assert 0 < pred.attention_share < 1


def test_fused_causal_skips_blocks_only_past_the_kernel_block():
    assert costmodel._flash_keys(256, causal=False) == 256 and costmodel._flash_keys(256, causal=True) == 256
    assert costmodel._flash_keys(4096, causal=True) < 0.6 * 4096


def test_pi5_is_faster_than_pi4_and_threads_help():
    for n in (64, 1024):
        assert costmodel.predict(MINILM, n, costmodel.PI5).total_ms < costmodel.predict(MINILM, n, costmodel.PI4).total_ms
    one, four = (costmodel.predict(MINILM, 512, costmodel.PI4, threads=t).total_ms for t in (1, 4))
    assert four < one
    with pytest.raises(ValueError, match="threads"):
        costmodel.PI4.at_threads(0)


def test_published_figures_are_in_the_profiles():
    assert costmodel.PI4.gemm_gflops == pytest.approx(1.5 * 11.9) and costmodel.PI4.dram_gbs == 5.5
    assert "11.9" in costmodel.PI4.source and "30.2" in costmodel.PI5.source and costmodel.PI5.cores == 4


def test_bad_sequence_length_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        costmodel.model_ops(MINILM, 0)


def test_speedup_bound_from_the_per_head_share():
    assert costmodel.speedup_bound(MINILM, 256, 1.0, costmodel.PI4) == pytest.approx(1.0)
    half = costmodel.speedup_bound(MINILM, 256, 0.5, costmodel.PI4)
    none = costmodel.speedup_bound(MINILM, 256, 0.0, costmodel.PI4)
    assert 1 < half < none < 10
    # the bound is what pruning achieves in the model itself, MLP untouched
    pruned = costmodel.predict(with_heads(MINILM, 6), 256, costmodel.PI4).total_ms
    assert costmodel.predict(MINILM, 256, costmodel.PI4).total_ms / pruned <= half * 1.01
    assert costmodel.speedup_bound(MINILM, 4096, 0.5, costmodel.PI4) > half  # attention weighs more at long n
    with pytest.raises(ValueError):
        costmodel.speedup_bound(MINILM, 256, 1.5, costmodel.PI4)


def test_attention_crossover():
    n = costmodel.attention_crossover(MINILM, costmodel.PI4, "eager")
    assert n is not None and costmodel.predict(MINILM, n, costmodel.PI4, "eager").attention_share >= 0.5
    assert costmodel.predict(MINILM, int(n * 0.9), costmodel.PI4, "eager").attention_share < 0.5
    assert costmodel.attention_crossover(MINILM, costmodel.PI4, "fused") > n  # the fused kernel pushes it out
    assert costmodel.attention_crossover(MINILM, costmodel.PI4, "linear") is None


@pytest.mark.parametrize("spec", ["synthetic:layers=2,d=48,heads=4,ff=96,vocab=77,positions=40",
                                  "synthetic:family=llama,layers=2,d=48,heads=4,kv=2,ff=96,vocab=77"])
def test_weights_mb_matches_the_modules(spec):
    cfg = parse_synthetic(spec)
    params = sum(p.numel() for p in random_model(cfg).net.parameters())
    assert costmodel.weights_mb(cfg) == pytest.approx(4 * params / 2**20, rel=0.05)


def test_activation_memory_quadratic_for_eager_linear_for_chunked():
    eager = [costmodel.activation_mb(MINILM, n, "eager") for n in (2048, 4096)]
    chunked = [costmodel.activation_mb(MINILM, n, "chunked:256") for n in (2048, 4096)]
    assert eager[1] / eager[0] > 3.5 and chunked[1] / chunked[0] < 2.5
    assert chunked[1] < eager[1] / 8


def test_recalibrate_recovers_a_slower_device():
    true = costmodel.DeviceProfile(**{**costmodel.PI4.__dict__, "gemm_gflops": costmodel.PI4.gemm_gflops / 2,
                               "bmm_gflops": costmodel.PI4.bmm_gflops / 2, "sdpa_gflops": costmodel.PI4.sdpa_gflops / 2,
                               "vector_gflops": costmodel.PI4.vector_gflops / 2, "dram_gbs": costmodel.PI4.dram_gbs / 2,
                               "cache_gbs": costmodel.PI4.cache_gbs / 2, "fault_gbs": costmodel.PI4.fault_gbs / 2,
                               "overhead_us": costmodel.PI4.overhead_us * 3})
    points = [(MINILM, n, "fused", 4, costmodel.predict(MINILM, n, true, threads=4).total_ms) for n in (8, 16, 64, 256, 512)]
    fitted = calibrate.recalibrate(costmodel.PI4, points)
    for cfg, n, v, t, ms in points:
        assert costmodel.predict(cfg, n, fitted, v, threads=t).total_ms == pytest.approx(ms, rel=0.01)
    assert fitted.overhead_us == pytest.approx(3 * costmodel.PI4.overhead_us, rel=0.05)
    assert "recalibrated" in fitted.name
    with pytest.raises(ValueError, match="at least two"):
        calibrate.recalibrate(costmodel.PI4, points[:1])


def test_host_calibration_gives_a_usable_profile():
    p = calibrate.calibrate_host(quick=True)
    values = [p.gemm_gflops, p.bmm_gflops, p.sdpa_gflops, p.vector_gflops, p.dram_gbs, p.cache_gbs,
              p.fault_gbs, p.overhead_us, p.half_rows]
    assert all(math.isfinite(x) and x > 0 for x in values) and p.threads == torch.get_num_threads()
    assert costmodel.predict(MINILM, 64, p).total_ms > 0
    with pytest.raises(ValueError, match="clock"):
        calibrate.calibrate_host(clock="sundial")


# ---------------------------------------------------------------- fit and crossover (latency.compare)
def test_quadratic_fit_recovers_coefficients_and_crossover():
    ns = np.array([16, 32, 64, 128, 256, 512, 1024])
    a, b, c = compare.fit_quadratic(ns, 3.0 + 0.2 * ns + 1e-4 * ns ** 2)
    assert (a, b, c) == pytest.approx((3.0, 0.2, 1e-4), rel=1e-6)
    n = compare.crossover_n(a, b, c)
    assert c * n * n == pytest.approx(a + b * n)
    assert compare.crossover_n(1.0, 1.0, 0.0) is None
    assert min(compare.fit_quadratic(ns, 5.0 + 0.1 * ns)) >= 0  # no negative coefficients on linear data
    with pytest.raises(ValueError, match="three"):
        compare.fit_quadratic([16, 32], [1.0, 2.0])


# ---------------------------------------------------------------- engines, dtypes, published runs


@pytest.mark.parametrize("run", published.RUNS, ids=lambda r: r.label)
def test_every_published_run_within_25_percent(run):
    """Each published Pi run the engines are fitted to comes out within ±25% (tokens/s or ms)."""
    assert published.predicted(run) == pytest.approx(run.published, rel=0.25)


def test_published_runs_cite_their_source_and_cover_every_engine():
    assert all(r.source and ("github.com" in r.source or "justine.lol" in r.source) for r in published.RUNS)
    covered = {(r.device, r.engine) for r in published.RUNS}
    assert {("pi4", "torch"), ("pi4", "ncnn"), ("pi5", "ncnn"), ("pi5", "ggml"), ("pi4", "ggml")} <= covered


def test_thread_curve_saturates_per_device_and_engine():
    """Pi 5 with ncnn: x2.0 from 1 to 4 threads (published); Pi 4: x3.5; never beyond the cores."""
    p5, p4 = engines.engine_profile("pi5", "ncnn", "fp16"), engines.engine_profile("pi4", "ncnn", "fp32")
    assert p5.speedup(4) == pytest.approx(2.04, rel=0.03) and p4.speedup(4) == pytest.approx(3.46, rel=0.03)
    assert p5.speedup(8) == p5.speedup(4) and p5.speedup(1) == 1.0
    vit = shapes.parse_shape(published.VIT_B32)
    one, four = (costmodel.predict(vit, 145, p5, "eager", threads=t).total_ms for t in (1, 4))
    assert 1.8 < one / four < 2.3


def test_engines_differ_and_dtypes_change_bytes():
    cfg = shapes.parse_shape(published.TINYLLAMA)
    tg = {d: decode.predict_tg(cfg, engines.engine_profile("pi5", "ggml", d)) for d in ("fp16", "q8_0", "q4_0")}
    assert tg["fp16"] < tg["q8_0"] < tg["q4_0"]   # decode streams the weights: fewer bytes, more tokens/s
    torch_ms = costmodel.predict(MINILM, 32, engines.engine_profile("pi4", "torch", "fp32")).total_ms
    ncnn_ms = costmodel.predict(MINILM, 32, engines.engine_profile("pi4", "ncnn", "fp32")).total_ms
    assert torch_ms > 2 * ncnn_ms  # PyTorch's per-call overhead dominates a small model on a Pi
    assert costmodel.predict(MINILM, 32, engines.engine_profile("pi4", "torch", "int8")).total_ms < torch_ms
    with pytest.raises(ValueError, match="runs"):
        engines.engine_profile("pi4", "torch", "q4_0")
    with pytest.raises(ValueError, match="unknown engine"):
        engines.engine_profile("pi4", "onnx", "fp32")


def test_shapes_explicit_flops_and_bottleneck():
    flop = shapes.parse_shape("synthetic:gflops=8.2,mparams=25.6,calls=50")
    assert shapes.shape_flops(flop, 1) == pytest.approx(8.2e9)
    p = engines.engine_profile("pi4", "ncnn", "fp32")
    double = shapes.parse_shape("synthetic:gflops=16.4,mparams=25.6,calls=50")
    assert 1.8 < costmodel.predict(double, 1, p).total_ms / costmodel.predict(flop, 1, p).total_ms <= 2.0
    mobilebert = shapes.parse_shape("synthetic:layers=24,d=512,bottleneck=128,heads=4,ff=512,ffns=4")
    plain = shapes.parse_shape("synthetic:layers=24,d=512,heads=4,ff=2048")
    assert isinstance(mobilebert, shapes.Bottleneck) and mobilebert.inner.d_model == 128
    assert shapes.shape_flops(mobilebert, 128) < shapes.shape_flops(plain, 128) / 2
    for bad in ("synthetic:gflops=-1", "synthetic:gflops=1,colour=2", "synthetic:layers=2,bottleneck=8,heads=2"):
        with pytest.raises(ValueError):
            shapes.parse_shape(bad)


def test_decode_ops_grow_with_depth_and_refuse_encoders():
    cfg = shapes.parse_shape(published.TINYLLAMA)
    p = engines.engine_profile("pi5", "ggml", "fp16")
    assert decode.predict_tg(cfg, p, depth=4096) < decode.predict_tg(cfg, p, depth=0)
    with pytest.raises(ValueError, match="causal"):
        decode.decode_ops(MINILM, 0)


def test_ggml_q8_0_is_fitted_to_published_runs_not_derived():
    """Llama.cpp's q8_0 TinyLlama runs on a Pi 4 and a Pi 5 fit their own factors, and a
    Llama 2 7B Q4_0 prompt on a Pi 5 fits pi5's q4_0; pi4's q4_0 (no usable run) is derived from q8_0."""
    for device in ("pi4", "pi5"):
        assert (device, "ggml", "q8_0") in engines.FITS
        assert "q8_0" in engines.FITS[(device, "ggml", "q8_0")].source
        assert any(r.device == device and r.dtype == "q8_0" for r in published.RUNS)
    assert "q4_0 derived" in engines.engine_profile("pi4", "ggml", "q4_0").source  # no usable Pi 4 q4_0 run
    assert ("pi5", "ggml", "q4_0") in engines.FITS and any(r.dtype == "q4_0" for r in published.RUNS)
    for device in ("pi4", "pi5"):
        assert "int8 derived" in engines.engine_profile(device, "torch", "int8").source
    assert any(r.dtype == "q4_0" and r.metric == "tg_tps" for r in published.RUNS)  # q4_0 decode checked too


def test_pi5_torch_is_the_hat_fit_times_the_published_pytorch_speed_up():
    """PyTorch on a Pi 5: the same two PyTorch networks on both Pis (Ultralytics' YOLOv8n / s) give the
    Pi 4 -> Pi 5 speed-up of PyTorch's compute; the Pi 4 HAT fit times it, for a transformer too."""
    runs = {r.device: r for r in published.RUNS if r.metric == "ms_per_gflop"}
    assert set(runs) == {"pi4", "pi5"} and all(r.engine == "torch" and r.dtype == "fp32" for r in runs.values())
    published_speedup = runs["pi4"].published / runs["pi5"].published
    modelled = published.predicted(runs["pi4"]) / published.predicted(runs["pi5"])
    assert published_speedup == pytest.approx(3.30, rel=0.01) and modelled == pytest.approx(published_speedup, rel=0.02)
    hat = shapes.parse_shape(published.hat_shape(512, 1536))
    pi4, pi5 = (costmodel.predict(hat, 30, engines.engine_profile(d, "torch", "fp32"), threads=4).total_ms for d in ("pi4", "pi5"))
    assert pi4 / pi5 == pytest.approx(published_speedup, rel=0.05)
    assert "Ultralytics" in engines.engine_profile("pi5", "torch", "fp32").source
    with pytest.raises(ValueError, match="same kernel count"):
        published.predicted(published.Run("x", "pi4", "torch", "fp32", published.YOLOV8N, 1, 4, "ms_per_gflop", 1.0,
                                          shape2="synthetic:gflops=30,mparams=11,calls=50"))


def test_bf16_is_measured_here_not_modelled_on_a_pi():
    """The Pi's A72 / A76 have no bf16 arithmetic: no Pi row in bf16, and the refusal says why."""
    assert "bf16" not in engines.ENGINE_DTYPES["torch"]
    with pytest.raises(ValueError, match="no bf16 arithmetic"):
        engines.engine_profile("pi5", "torch", "bf16")
    with pytest.raises(ValueError, match="no bf16 arithmetic"):
        sweep.SweepPlan(models=["minilm"], seq_lens=[8], backends=["cpu", "pi4"], dtypes=["bf16"]).check()
    assert sweep.SweepPlan(models=["minilm"], seq_lens=[8], backends=["cpu"], dtypes=["bf16"]).check()


def test_calibration_figure_draws_every_run_in_its_band():
    """The Latency page's calibration figure: one marker per published run, fitted filled and checks
    hollow, on one row per device · engine · dtype, with the ±25% band; an empty table is refused."""
    runs = pd.DataFrame(published.table())
    fig = calibration_figure(runs)
    points = sum(len(t.x) for t in fig.data)
    assert points == len(published.RUNS) and all(abs(x) <= BAND for t in fig.data for x in t.x)
    symbols = {t.name.split(" (")[1].rstrip(")"): t.marker.symbol for t in fig.data}
    assert symbols == {"fit": "circle", "check": "circle-open"}
    rows = {y for t in fig.data for y in t.y}
    assert "pi5 · torch · fp32" in rows and "pi4 · ggml · fp16" in rows
    assert f"{len(runs)} published Pi runs" in fig.layout.title.text
    with pytest.raises(ValueError, match="no published runs"):
        calibration_figure(runs.iloc[:0])


def test_the_decoder_families_structure_prices_what_the_blocks_run():
    """Sliding windows cost O(n·w) (the local path the block takes), K/V groups and head width
    count, and a mixture of experts does k experts' work per token but holds all E."""
    from attnviz.core.config import Config
    base = Config(family="x", task="lm", n_layers=6, n_heads=8, n_kv_heads=2, d_model=256, d_head=64, d_ff=512,
                  vocab_size=1000, positional="rotary", causal=True, pre_norm=True, norm="rmsnorm",
                  gated_mlp=True, activation="silu", max_positions=8192)

    def attention_flops(cfg, n):
        return sum(op.flops * count for op, count in costmodel.op_counts(cfg, n) if op.group == "attention")

    windowed = base.replace(windows=(128,) * 6)
    for n in (2048, 4096):
        assert attention_flops(windowed, n) < attention_flops(base, n) / 4
    ratio = attention_flops(windowed, 4096) / attention_flops(windowed, 2048)
    assert 1.8 < ratio < 2.2                                     # linear in n, not quadratic
    mixed = base.replace(windows=(128, 128, 0, 128, 128, 0))    # local and global layers priced apart
    assert attention_flops(windowed, 4096) < attention_flops(mixed, 4096) < attention_flops(base, 4096)
    wide = base.replace(d_head=128)
    assert attention_flops(wide, 1024) > 1.9 * attention_flops(base, 1024)
    moe = base.replace(n_experts=8, experts_per_token=2)
    mlp = lambda cfg: sum(op.flops * c for op, c in costmodel.op_counts(cfg, 512) if op.group == "mlp")  # noqa: E731
    assert 2.0 <= mlp(moe) / mlp(base) < 2.1                     # two experts' work, and the router
    assert costmodel.weights_mb(moe) > 4 * costmodel.weights_mb(base)   # but all eight held
