"""Activation patching against patching done by hand: torch hooks on the model's modules copy the
clean run's activation into the corrupted run, an implementation independent of the runner's
per-call patch."""
import pytest
import torch

from attnviz.analysis import patching
from attnviz.weights import catalogue
from attnviz.weights.catalogue import random_model
from tests.tiny import LLAMA

CLEAN = [3, 17, 5, 42, 8, 8, 21, 30, 2]
CORRUPTED = [3, 17, 5, 42, 9, 8, 21, 30, 2]
TARGET, MINUS = 7, 11


def columns(model, layer, kind, unit):
    """The slice of a layer's fused QKV output (or of the output projection's input) one unit is."""
    attn = model.net.blocks[layer].attn
    h, hkv, dh = attn.n_heads * attn.d_head, attn.n_kv * attn.d_head, attn.d_head
    start = {"q": 0, "k": h, "v": h + hkv, "z": 0}[kind] + unit * dh
    return slice(start, start + dh)


def hand_diff(model, clean, corrupted, layer, kind, unit, target, minus):
    """The corrupted run's logit difference with one activation copied from the clean run, BY HAND."""
    blocks = model.net.blocks
    module = blocks[layer].attn.out if kind == "z" else blocks[layer].attn.qkv if kind != "resid_pre" \
        else blocks[layer]
    kept = {}

    def grab_in(mod, args):
        kept["x"] = args[0].clone()

    def grab_out(mod, args, out):
        kept["x"] = out.clone()

    def put_in(mod, args):
        x = args[0].clone()
        if kind == "resid_pre":
            x[:, unit] = kept["x"][:, unit]
        else:
            s = columns(model, layer, kind, unit)
            x[..., s] = kept["x"][..., s]
        return (x,) + tuple(args[1:])

    def put_out(mod, args, out):
        out = out.clone()
        s = columns(model, layer, kind, unit)
        out[..., s] = kept["x"][..., s]
        return out

    on_input = kind in ("z", "resid_pre")
    handle = module.register_forward_pre_hook(grab_in) if on_input else module.register_forward_hook(grab_out)
    with torch.no_grad():
        model.net(input_ids=torch.tensor([clean]))
    handle.remove()
    handle = module.register_forward_pre_hook(put_in) if on_input else module.register_forward_hook(put_out)
    try:
        with torch.no_grad():
            logits = model.net(input_ids=torch.tensor([corrupted])).logits[0, -1]
    finally:
        handle.remove()
    return float(logits[target] - logits[minus])


@pytest.fixture(scope="module")
def tiny():
    return random_model(LLAMA, seed=5)


@pytest.mark.parametrize("kind", ["z", "q", "k", "v", "resid_pre"])
def test_maps_match_patching_by_hand(tiny, kind):
    pair = patching.prepare(tiny, CLEAN, CORRUPTED, TARGET, MINUS)
    got = patching.patch_map(tiny, pair, kind)
    cols = {"z": 4, "q": 4, "k": 2, "v": 2, "resid_pre": len(CLEAN)}[kind]
    assert got.recovered.shape == (3, cols)
    for layer in range(3):
        for unit in range(cols):
            want = hand_diff(tiny, CLEAN, CORRUPTED, layer, kind, unit, TARGET, MINUS)
            assert abs(float(got.diffs[layer, unit]) - want) < 1e-4
            rec = (want - pair.corrupted_diff) / (pair.clean_diff - pair.corrupted_diff)
            assert abs(float(got.recovered[layer, unit]) - rec) < 1e-4
    # patching the whole residual stream at layer 0 is the clean run; before the changed token, nothing
    if kind == "resid_pre":
        assert abs(float(got.recovered[0, 4]) - 1) < 1e-4
        assert abs(float(got.recovered[0, 0])) < 1e-4
    frame = patching.patch_frame(got)
    assert len(frame) == 3 * cols and set(frame.columns) >= {"layer", "unit", "recovered"}


def test_progress_and_cancel(tiny):
    pair = patching.prepare(tiny, CLEAN, CORRUPTED, TARGET, MINUS)
    seen = []
    patching.patch_map(tiny, pair, "z", progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (12, 12) and len(seen) == 12

    def stop():
        raise ValueError("cancelled")
    with pytest.raises(ValueError, match="cancelled"):
        patching.patch_map(tiny, pair, "z", check=stop)


def test_refusals(tiny):
    with pytest.raises(ValueError, match="same length"):
        patching.prepare(tiny, CLEAN, CORRUPTED[:-1], TARGET, MINUS)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        patching.prepare(tiny, CLEAN, CORRUPTED, 10_000, MINUS)
    with pytest.raises(ValueError, match="same"):
        patching.prepare(tiny, CLEAN, CORRUPTED, TARGET, TARGET)
    with pytest.raises(ValueError, match="nothing to recover"):
        patching.prepare(tiny, CLEAN, CLEAN, TARGET, MINUS)
    pair = patching.prepare(tiny, CLEAN, CORRUPTED, TARGET, MINUS)
    with pytest.raises(ValueError, match="unknown activation"):
        patching.patch_map(tiny, pair, "mlp")


@pytest.mark.parametrize("kind,layer,unit", [("z", 14, 3), ("k", 20, 1), ("resid_pre", 10, 9)])
def test_smollm2_mary_john_matches_by_hand(kind, layer, unit):
    model = catalogue.load_model("smollm2")
    pair = patching.prepare(model, patching.SAMPLE_CLEAN, patching.SAMPLE_CORRUPTED, " Mary", " John")
    assert pair.clean_diff > 0 > pair.corrupted_diff      # the clean prompt prefers Mary, the corrupted John
    clean, corrupted = (model.inputs(t)["ids"].tolist() for t in (patching.SAMPLE_CLEAN, patching.SAMPLE_CORRUPTED))
    want = hand_diff(model, clean, corrupted, layer, kind, unit, pair.target, pair.minus)
    got = patching.patch_map(model, pair, kind, units={layer: [unit]})
    assert abs(float(got.diffs[layer, unit]) - want) < 1e-4
