"""Attention variants against their definitions: chunked = exact softmax, local and causal masks,
linear = its explicit quadratic form, ReLU, top-k, temperature; every fast path against the
written-out one, with grouped K/V heads, padding and causal masks."""
import math

import pytest
import torch
import torch.nn.functional as F

from attnviz.core.attention import (EAGER, SOFTMAX, Variant, attend, causal_mask, linear_weights, local_mask,
                               padding_mask, parse_variant, relu_weights)
from attnviz.weights.catalogue import random_model
from attnviz.latency.results import parse_synthetic

TOL = 1e-5
B, H, HKV, T, DH = 2, 6, 3, 37, 16


@pytest.fixture
def qkv():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, T, DH, generator=g), torch.randn(B, HKV, T, DH, generator=g),
            torch.randn(B, HKV, T, DH, generator=g))


def reference_softmax(q, k, v, allowed=None):
    """Softmax attention from the definition, K/V heads repeated for their query groups."""
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, -1) @ v


def phi(x):
    return F.elu(x) + 1


def pad_mask():
    keep = torch.ones(B, T)
    keep[1, -6:] = 0
    return padding_mask(keep)


# ---------------------------------------------------------------- parsing
@pytest.mark.parametrize("spec,name", [("softmax", "fused"), ("fused", "fused"), ("eager", "eager"),
                                       ("chunked:128", "chunked:128"), ("local:64", "local:64"),
                                       ("linear", "linear"), ("relu", "relu"), ("topk:8", "topk:8"),
                                       ("temp:2", "fused@T=2"), (" Local:5 ", "local:5"),
                                       ("local:8@T=0.5", "local:8@T=0.5")])
def test_each_variant_has_one_name_that_parses_back(spec, name):
    """One name per variant (the bench CSV's 'fused' included), and it reads back as the variant."""
    v = parse_variant(spec)
    assert v.name == v.label == name
    assert parse_variant(v.name) == v
    assert parse_variant(Variant("softmax", temperature=1 / 3).name).temperature == 1 / 3


def test_eager_and_fused_are_distinct_variants():
    assert parse_variant("fused") == SOFTMAX and parse_variant("eager") == EAGER and EAGER != SOFTMAX


@pytest.mark.parametrize("spec,words", [("local:0", "window"), ("chunked:x", "not a number"),
                                        ("bogus", "unknown attention variant"), ("topk:0", "k of at least 1"),
                                        ("temp:0", "temperature must be positive"), ("chunked:-4", "chunk")])
def test_parse_variant_refuses_bad_specs(spec, words):
    with pytest.raises(ValueError, match=words):
        parse_variant(spec)


# ---------------------------------------------------------------- masks
def test_causal_mask_is_lower_triangular_and_right_aligned():
    assert torch.equal(causal_mask(4), torch.ones(4, 4, dtype=torch.bool).tril())
    # two new queries after two cached keys: query 0 sees keys 0..2, query 1 sees all four
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]


def test_local_masks_hold_exactly_the_window():
    i = torch.arange(6)
    expected = (i[:, None] - i[None, :]).abs() < 2
    assert torch.equal(local_mask(6, 2, causal=False), expected)
    assert local_mask(6, 2, causal=True).tolist()[3] == [False, False, True, True, False, False]
    assert local_mask(5, 1, causal=True).equal(torch.eye(5, dtype=torch.bool))


# ---------------------------------------------------------------- exactness of every path
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, T, 100])
@pytest.mark.parametrize("padded", [False, True])
def test_chunked_equals_exact_softmax(qkv, causal, chunk, padded):
    q, k, v = qkv
    allowed = pad_mask() if padded else None
    full = allowed if not causal else (causal_mask(T) if allowed is None else allowed & causal_mask(T))
    out, _ = attend(q, k, v, causal=causal, allowed=allowed, variant=parse_variant(f"chunked:{chunk}"))
    assert (out - reference_softmax(q, k, v, full)).abs().max() < TOL
    exact, _ = attend(q, k, v, causal=causal, allowed=allowed, variant=EAGER)
    assert (out - exact).abs().max() < TOL


@pytest.mark.parametrize("spec", ["softmax", "eager", "chunked:5", "local:4", "local:100", "linear", "relu",
                                  "topk:3", "temp:0.5"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_fast_path_equals_written_out_path(qkv, spec, causal, padded):
    q, k, v = qkv
    allowed = pad_mask() if padded else None
    fast, none = attend(q, k, v, causal=causal, allowed=allowed, variant=parse_variant(spec))
    slow, weights = attend(q, k, v, causal=causal, allowed=allowed, variant=parse_variant(spec), need_weights=True)
    assert none is None and weights.shape == (B, H, T, T)
    assert torch.isfinite(fast).all()
    assert (fast - slow).abs().max() < TOL


@pytest.mark.parametrize("spec", ["softmax", "eager", "chunked:4", "local:3", "linear", "relu", "topk:2"])
def test_causal_outputs_ignore_the_future(qkv, spec):
    q, k, v = qkv
    out, _ = attend(q, k, v, causal=True, variant=parse_variant(spec))
    k2, v2 = k.clone(), v.clone()
    k2[..., 20:, :] += 5.0
    v2[..., 20:, :] -= 3.0
    out2, _ = attend(q, k2, v2, causal=True, variant=parse_variant(spec))
    assert (out[..., :20, :] - out2[..., :20, :]).abs().max() < TOL
    assert (out[..., 20:, :] - out2[..., 20:, :]).abs().max() > 1e-2


@pytest.mark.parametrize("spec", ["softmax", "eager", "chunked:8", "local:6", "relu", "topk:4"])
def test_weights_respect_causal_and_local_masks(qkv, spec):
    q, k, v = qkv
    variant = parse_variant(spec)
    _, w = attend(q, k, v, causal=True, variant=variant, need_weights=True)
    allowed = local_mask(T, variant.window, True) if variant.kind == "local" else causal_mask(T)
    assert w.masked_select(~allowed).abs().max() == 0
    if variant.kind != "relu":
        assert torch.allclose(w.sum(-1), torch.ones(B, H, T), atol=1e-5)


def test_local_window_at_least_n_equals_full_softmax(qkv):
    q, k, v = qkv
    for causal in (False, True):
        full, _ = attend(q, k, v, causal=causal)
        local, _ = attend(q, k, v, causal=causal, variant=parse_variant(f"local:{T}"))
        assert (full - local).abs().max() < TOL


def test_local_attention_equals_masked_softmax_definition(qkv):
    q, k, v = qkv
    for causal in (False, True):
        out, _ = attend(q, k, v, causal=causal, variant=Variant("local", window=5))
        assert (out - reference_softmax(q, k, v, local_mask(T, 5, causal))).abs().max() < TOL


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_equals_its_explicit_quadratic_form(qkv, causal):
    q, k, v = qkv
    kr, vr = (x.repeat_interleave(H // HKV, dim=1) for x in (k, v))
    a = phi(q) @ phi(kr).transpose(-2, -1)          # (B, H, T, T), all positive
    if causal:
        a = a * causal_mask(T)
    expected = (a / a.sum(-1, keepdim=True)) @ vr
    out, _ = attend(q, k, v, causal=causal, variant=parse_variant("linear"))
    assert (out - expected).abs().max() < TOL
    w = linear_weights(q, kr, causal_mask(T) if causal else None)
    assert (w - a / a.sum(-1, keepdim=True)).abs().max() < TOL


def test_linear_causal_blocks_cover_lengths_that_are_not_multiples_of_the_block():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 130, 8, generator=g) for _ in range(3))
    a = (phi(q) @ phi(k).transpose(-2, -1)) * causal_mask(130)
    out, _ = attend(q, k, v, causal=True, variant=parse_variant("linear"))
    assert (out - (a / a.sum(-1, keepdim=True)) @ v).abs().max() < TOL


def test_relu_attention_divides_by_visible_keys(qkv):
    q, k, _ = qkv
    kr = k.repeat_interleave(H // HKV, dim=1)
    s = torch.relu(q @ kr.transpose(-2, -1) / math.sqrt(DH))
    assert (relu_weights(q, kr) - s / T).abs().max() < TOL
    visible = torch.arange(1, T + 1).float()[:, None]
    assert (relu_weights(q, kr, causal_mask(T)) - s * causal_mask(T) / visible).abs().max() < TOL


def test_topk_keeps_exactly_k_keys_per_query(qkv):
    q, k, v = qkv
    _, w = attend(q, k, v, variant=parse_variant("topk:4"), need_weights=True)
    assert ((w > 0).sum(-1) == 4).all()


def test_temperature_flattens_the_weights(qkv):
    q, k, v = qkv
    _, cold = attend(q, k, v, need_weights=True)
    _, hot = attend(q, k, v, variant=parse_variant("temp:4"), need_weights=True)
    entropy = lambda w: -(w * w.clamp_min(1e-12).log()).sum(-1).mean()  # noqa: E731
    assert entropy(hot) > entropy(cold)


def test_a_query_that_sees_no_key_gets_zeros_not_nan(qkv):
    q, k, v = qkv
    allowed = torch.ones(T, T, dtype=torch.bool)
    allowed[3] = False
    fused, _ = attend(q, k, v, allowed=allowed)
    eager, w = attend(q, k, v, allowed=allowed, need_weights=True)
    assert torch.isfinite(eager).all() and w[..., 3, :].abs().max() == 0
    assert (fused - eager).abs().max() < TOL


def test_fused_causal_with_padding_keeps_causality(qkv):
    """Regression: is_causal was dropped when a padding mask was given to the fused kernel."""
    q, k, v = qkv
    allowed = pad_mask()
    out, _ = attend(q, k, v, causal=True, allowed=allowed)
    assert (out - reference_softmax(q, k, v, allowed & causal_mask(T))).abs().max() < TOL


# ---------------------------------------------------------------- inside a model
@pytest.mark.parametrize("spec", ["synthetic:layers=2,d=32,heads=4,ff=48,vocab=50,positions=64",
                                  "synthetic:layers=2,d=32,heads=4,kv=2,ff=48,vocab=50,positions=64,causal=1"])
def test_model_outputs_agree_across_exact_variants(spec):
    model = random_model(parse_synthetic(spec))
    ids = torch.randint(0, 50, (1, 23), generator=torch.Generator().manual_seed(0))
    base = model.net(input_ids=ids).hidden
    for name in ("eager", "chunked:5", "local:23"):
        other = model.net(input_ids=ids, variants=parse_variant(name)).hidden
        assert (other - base).abs().max() < TOL, name
    changed = model.net(input_ids=ids, variants=parse_variant("linear")).hidden
    assert (changed - base).abs().max() > 1e-3  # linear is a different attention, not a rounding


@pytest.mark.parametrize("spec", ["softmax", "eager", "chunked:5", "local:4", "linear", "relu", "topk:3"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_every_variant_trains(spec, need_weights):
    """The toy-training lab backpropagates through every path, masked rows included."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, n, 19, 8, generator=g).requires_grad_() for n in (4, 2, 2))
    allowed = torch.ones(19, 19, dtype=torch.bool)
    allowed[3] = False
    out, _ = attend(q, k, v, causal=True, allowed=allowed if need_weights else None,
                    variant=parse_variant(spec), need_weights=need_weights)
    out.square().sum().backward()
    assert all(torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0 for t in (q, k, v))
