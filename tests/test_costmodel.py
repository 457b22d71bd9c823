"""The cost model: it grows with n and heads, attention is quadratic where it should be, profiles
and recalibration behave, memory and weight estimates match the modules; the fit and crossover."""
import math

import numpy as np
import pytest
import torch

from attnviz.latency import calibrate, compare
from attnviz.latency import costmodel as cm
from attnviz.weights.catalogue import random_model
from attnviz.latency.results import parse_synthetic, with_heads

MINILM = parse_synthetic("synthetic:layers=6,d=384,heads=12,ff=1536,vocab=30522,positions=512")
SMOLLM2 = parse_synthetic("synthetic:family=llama,layers=30,d=576,heads=9,kv=3,dh=64,ff=1536,vocab=49152")
PROFILES = [cm.PI4, cm.PI5, cm.HOST_GUESS]
NS = [16, 32, 64, 128, 256, 512, 1024, 2048]


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
@pytest.mark.parametrize("variant", ["fused", "eager", "chunked:128", "local:64", "linear", "relu"])
@pytest.mark.parametrize("cfg", [MINILM, SMOLLM2], ids=["minilm", "smollm2"])
def test_latency_grows_with_n(profile, variant, cfg):
    times = [cm.predict(cfg, n, profile, variant).total_ms for n in NS]
    assert all(b > a for a, b in zip(times, times[1:]))


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
@pytest.mark.parametrize("variant", ["fused", "eager", "linear"])
def test_latency_grows_with_heads(profile, variant):
    cfg = parse_synthetic("synthetic:layers=4,d=256,heads=8,dh=32,ff=1024")
    times = [cm.predict(with_heads(cfg, k), 512, profile, variant).total_ms for k in (1, 2, 4, 8)]
    assert all(b > a for a, b in zip(times, times[1:]))
    # heads of their own width (fixed d_head) add work; more heads in the same d_model do not shrink it
    wide = [cm.predict(parse_synthetic(f"synthetic:layers=4,d=256,heads={h},dh=32,ff=1024"), 512, profile,
                       variant).total_ms for h in (4, 8)]
    assert wide[1] > wide[0]


def test_attention_work_is_quadratic_unless_linear():
    def attention_flops(variant, n):
        return sum(op.flops for op in cm.model_ops(MINILM, n, variant) if op.group == "attention")
    for variant in ("eager", "fused", "chunked:64", "relu"):
        assert attention_flops(variant, 2048) / attention_flops(variant, 1024) == pytest.approx(4, rel=0.01)
    assert attention_flops("linear", 2048) / attention_flops("linear", 1024) == pytest.approx(2, rel=0.01)
    assert attention_flops("local:64", 4096) / attention_flops("local:64", 2048) == pytest.approx(2, rel=0.05)
    mlp = [sum(op.flops for op in cm.model_ops(MINILM, n) if op.group == "mlp") for n in (1024, 2048)]
    assert mlp[1] / mlp[0] == pytest.approx(2, rel=0.01)


def test_groups_add_up_to_the_total_and_every_op_costs_something():
    pred = cm.predict(SMOLLM2, 256, cm.PI4, "eager")
    assert sum(pred.by_group.values()) == pytest.approx(pred.total_ms)
    assert set(pred.by_group) == set(cm.GROUPS) and all(ms > 0 for _, ms in pred.ops)
    assert 0 < pred.attention_share < 1


def test_fused_causal_skips_blocks_only_past_the_kernel_block():
    assert cm._flash_keys(256, causal=False) == 256 and cm._flash_keys(256, causal=True) == 256
    assert cm._flash_keys(4096, causal=True) < 0.6 * 4096


def test_pi5_is_faster_than_pi4_and_threads_help():
    for n in (64, 1024):
        assert cm.predict(MINILM, n, cm.PI5).total_ms < cm.predict(MINILM, n, cm.PI4).total_ms
    one, four = (cm.predict(MINILM, 512, cm.PI4, threads=t).total_ms for t in (1, 4))
    assert four < one
    with pytest.raises(ValueError, match="threads"):
        cm.PI4.at_threads(0)


def test_published_figures_are_in_the_profiles():
    assert cm.PI4.gemm_gflops == pytest.approx(1.5 * 11.9) and cm.PI4.dram_gbs == 5.5
    assert "11.9" in cm.PI4.source and "30.2" in cm.PI5.source and cm.PI5.cores == 4


def test_bad_sequence_length_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        cm.model_ops(MINILM, 0)


def test_speedup_bound_from_the_per_head_share():
    assert cm.speedup_bound(MINILM, 256, 1.0, cm.PI4) == pytest.approx(1.0)
    half = cm.speedup_bound(MINILM, 256, 0.5, cm.PI4)
    none = cm.speedup_bound(MINILM, 256, 0.0, cm.PI4)
    assert 1 < half < none < 10
    # the bound is what pruning achieves in the model itself, MLP untouched
    pruned = cm.predict(with_heads(MINILM, 6), 256, cm.PI4).total_ms
    assert cm.predict(MINILM, 256, cm.PI4).total_ms / pruned <= half * 1.01
    assert cm.speedup_bound(MINILM, 4096, 0.5, cm.PI4) > half  # attention weighs more at long n
    with pytest.raises(ValueError):
        cm.speedup_bound(MINILM, 256, 1.5, cm.PI4)


def test_attention_crossover():
    n = cm.attention_crossover(MINILM, cm.PI4, "eager")
    assert n is not None and cm.predict(MINILM, n, cm.PI4, "eager").attention_share >= 0.5
    assert cm.predict(MINILM, int(n * 0.9), cm.PI4, "eager").attention_share < 0.5
    assert cm.attention_crossover(MINILM, cm.PI4, "fused") > n  # the fused kernel pushes it out
    assert cm.attention_crossover(MINILM, cm.PI4, "linear") is None


@pytest.mark.parametrize("spec", ["synthetic:layers=2,d=48,heads=4,ff=96,vocab=77,positions=40",
                                  "synthetic:family=llama,layers=2,d=48,heads=4,kv=2,ff=96,vocab=77"])
def test_weights_mb_matches_the_modules(spec):
    cfg = parse_synthetic(spec)
    params = sum(p.numel() for p in random_model(cfg).net.parameters())
    assert cm.weights_mb(cfg) == pytest.approx(4 * params / 2**20, rel=0.05)


def test_activation_memory_quadratic_for_eager_linear_for_chunked():
    eager = [cm.activation_mb(MINILM, n, "eager") for n in (2048, 4096)]
    chunked = [cm.activation_mb(MINILM, n, "chunked:256") for n in (2048, 4096)]
    assert eager[1] / eager[0] > 3.5 and chunked[1] / chunked[0] < 2.5
    assert chunked[1] < eager[1] / 8


def test_recalibrate_recovers_a_slower_device():
    true = cm.DeviceProfile(**{**cm.PI4.__dict__, "gemm_gflops": cm.PI4.gemm_gflops / 2,
                               "bmm_gflops": cm.PI4.bmm_gflops / 2, "sdpa_gflops": cm.PI4.sdpa_gflops / 2,
                               "vector_gflops": cm.PI4.vector_gflops / 2, "dram_gbs": cm.PI4.dram_gbs / 2,
                               "cache_gbs": cm.PI4.cache_gbs / 2, "fault_gbs": cm.PI4.fault_gbs / 2,
                               "overhead_us": cm.PI4.overhead_us * 3})
    points = [(MINILM, n, "fused", 4, cm.predict(MINILM, n, true, threads=4).total_ms) for n in (8, 16, 64, 256, 512)]
    fitted = calibrate.recalibrate(cm.PI4, points)
    for cfg, n, v, t, ms in points:
        assert cm.predict(cfg, n, fitted, v, threads=t).total_ms == pytest.approx(ms, rel=0.01)
    assert fitted.overhead_us == pytest.approx(3 * cm.PI4.overhead_us, rel=0.05)
    assert "recalibrated" in fitted.name
    with pytest.raises(ValueError, match="at least two"):
        calibrate.recalibrate(cm.PI4, points[:1])


def test_host_calibration_gives_a_usable_profile():
    p = calibrate.calibrate_host(quick=True)
    values = [p.gemm_gflops, p.bmm_gflops, p.sdpa_gflops, p.vector_gflops, p.dram_gbs, p.cache_gbs,
              p.fault_gbs, p.overhead_us, p.half_rows]
    assert all(math.isfinite(x) and x > 0 for x in values) and p.threads == torch.get_num_threads()
    assert cm.predict(MINILM, 64, p).total_ms > 0
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
