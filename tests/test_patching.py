"""Activation patching against patching done by hand: torch hooks on the model's modules copy the
clean run's activation into the corrupted run, an implementation independent of the runner's
per-call patch."""
import pytest
import torch

from attnviz.analysis import patching, patching_paths
from attnviz.core.transformer import sentence_embedding
from attnviz.weights import catalogue
from attnviz.weights.catalogue import random_model
from tests.tiny import BERT, LLAMA

CLEAN = [3, 17, 5, 42, 8, 8, 21, 30, 2]
CORRUPTED = [3, 17, 5, 42, 9, 8, 21, 30, 2]
TARGET, MINUS = 7, 11


def columns(model, layer, kind, unit):
    """The slice of a layer's fused QKV output (or of the output projection's input) one unit is."""
    attn = model.net.blocks[layer].attn
    h, hkv, dh = attn.n_heads * attn.d_head, attn.n_kv * attn.d_head, attn.d_head
    start = {"q": 0, "k": h, "v": h + hkv, "z": 0}[kind] + unit * dh
    return slice(start, start + dh)


def hand_diff(model, clean, corrupted, layer, kind, unit, target, minus, measure=None):
    """The corrupted run's logit difference (or `measure(output)`) with one activation copied from
    the clean run, BY HAND."""
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
            out = model.net(input_ids=torch.tensor([corrupted]))
    finally:
        handle.remove()
    return measure(out) if measure is not None else logit_diff(out, target, minus)


def logit_diff(out, target, minus):
    logits = out.logits[0, -1]
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
    assert seen == [(4, 12), (8, 12), (12, 12)]       # after each layer's batch of its 4 heads

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


# ---------------------------------------------------------------- path patching, by hand
def hand_path(model, clean, corrupted, sender, receiver, kind, target, minus):
    """Path patching BY HAND with module hooks: (1) the corrupted run with the sender head's input to
    the output projection taken from the clean run and every other head's frozen at the corrupted
    run's, in the sender's layer up to the receiver's; (2) the receiver's slice of the fused QKV
    output kept from that run; (3) a corrupted run with only that slice replaced."""
    (s, h), (r, unit) = sender, receiver
    blocks = model.net.blocks
    z = {"clean": {}, "bad": {}}

    def grab(run, i):
        def hook(mod, args):
            z[run][i] = args[0].clone()
        return hook
    for run, ids in (("clean", clean), ("bad", corrupted)):
        handles = [blocks[i].attn.out.register_forward_pre_hook(grab(run, i)) for i in range(len(blocks))]
        with torch.no_grad():
            model.net(input_ids=torch.tensor([ids]))
        for handle in handles:
            handle.remove()

    def freeze(i):
        def hook(mod, args):
            x = z["bad"][i].clone()
            if i == s:
                cols = columns(model, s, "z", h)
                x[..., cols] = z["clean"][i][..., cols]
            return (x,)
        return hook
    kept = {}
    cols = columns(model, r, kind, unit)

    def keep(mod, args, out):
        kept["x"] = out[..., cols].clone()

    def put(mod, args, out):
        out = out.clone()
        out[..., cols] = kept["x"]
        return out
    handles = [blocks[i].attn.out.register_forward_pre_hook(freeze(i)) for i in range(s, r)]
    handles.append(blocks[r].attn.qkv.register_forward_hook(keep))
    with torch.no_grad():
        model.net(input_ids=torch.tensor([corrupted]))
    for handle in handles:
        handle.remove()
    handle = blocks[r].attn.qkv.register_forward_hook(put)
    try:
        with torch.no_grad():
            out = model.net(input_ids=torch.tensor([corrupted]))
    finally:
        handle.remove()
    return logit_diff(out, target, minus)


@pytest.mark.parametrize("kind,unit", [("q", 3), ("k", 1), ("v", 0)])
def test_path_patching_matches_by_hand(tiny, kind, unit):
    pair = patching.prepare(tiny, CLEAN, CORRUPTED, TARGET, MINUS)
    got = patching_paths.path_map(tiny, pair, 2, unit, kind)
    assert got.recovered.shape == (3, 4) and torch.isnan(got.recovered[2]).all()
    for s in range(2):
        for h in range(4):
            want = hand_path(tiny, CLEAN, CORRUPTED, (s, h), (2, unit), kind, TARGET, MINUS)
            assert abs(float(got.diffs[s, h]) - want) < 1e-5
    # the sender's path is one part of its whole effect: a head with no effect has no path either
    assert torch.isfinite(got.recovered[:2]).all() and got.recovered[:2].abs().max() > 1e-4
    assert patching_paths.count(tiny, 2) == 8
    frame = patching.patch_frame(got)
    assert len(frame) == 8 and frame["activation"].iloc[0] == f"path to L2 {kind}{unit}"


def test_path_patching_refusals(tiny):
    pair = patching.prepare(tiny, CLEAN, CORRUPTED, TARGET, MINUS)
    with pytest.raises(ValueError, match="receiver's layer"):
        patching_paths.path_map(tiny, pair, 0, 0, "q")
    with pytest.raises(ValueError, match="K/V group 2"):
        patching_paths.path_map(tiny, pair, 1, 2, "k")
    with pytest.raises(ValueError, match="q, k or v"):
        patching_paths.path_map(tiny, pair, 1, 0, "z")


def test_smollm2_mary_john_path_matches_by_hand():
    model = catalogue.load_model("smollm2")
    pair = patching.prepare(model, patching.SAMPLE_CLEAN, patching.SAMPLE_CORRUPTED, " Mary", " John")
    clean, corrupted = (model.inputs(t)["ids"].tolist() for t in (patching.SAMPLE_CLEAN, patching.SAMPLE_CORRUPTED))
    got = patching_paths.path_map(model, pair, 23, 3, "q", senders={20: [0]})
    want = hand_path(model, clean, corrupted, (20, 0), (23, 3), "q", pair.target, pair.minus)
    assert abs(float(got.diffs[20, 0]) - want) < 1e-4
    assert int(torch.isfinite(got.recovered).sum()) == 1


# ---------------------------------------------------------------- an encoder's embedding metric
ENC_CLEAN = [2, 17, 5, 42, 8, 21, 3]
ENC_CORRUPTED = [2, 17, 5, 40, 8, 21, 3]


@pytest.mark.parametrize("metric", ["distance", "cosine"])
@pytest.mark.parametrize("kind", ["z", "v", "resid_pre"])
def test_encoder_maps_match_patching_by_hand(metric, kind):
    model = random_model(BERT, seed=3)
    pair = patching.prepare(model, ENC_CLEAN, ENC_CORRUPTED, metric=metric)
    with torch.no_grad():
        ref = sentence_embedding(model.net(input_ids=torch.tensor([ENC_CLEAN])).hidden[0])

    def measure(out):
        e = sentence_embedding(out.hidden[0])
        return float(e @ ref) if metric == "cosine" else -float((e - ref).norm())
    assert pair.clean_diff == pytest.approx(1.0 if metric == "cosine" else 0.0, abs=1e-6)
    got = patching.patch_map(model, pair, kind)
    for layer in range(2):
        for unit in range(got.recovered.shape[1]):
            want = hand_diff(model, ENC_CLEAN, ENC_CORRUPTED, layer, kind, unit, None, None, measure)
            assert abs(float(got.diffs[layer, unit]) - want) < 1e-5
    if kind == "resid_pre":  # the whole input of block 0 at the changed position is the clean run
        assert float(got.recovered[0, 3]) == pytest.approx(1.0, abs=1e-5)
    assert f"patched_{metric}" in patching.patch_frame(got).columns


def test_encoder_metric_refusals(tiny):
    model = random_model(BERT, seed=3)
    with pytest.raises(ValueError, match="does not fit"):
        patching.prepare(model, ENC_CLEAN, ENC_CORRUPTED, metric="logit_diff")
    with pytest.raises(ValueError, match="does not fit"):
        patching.prepare(tiny, CLEAN, CORRUPTED, TARGET, MINUS, metric="cosine")


@pytest.mark.parametrize("kind,layer,unit", [("z", 2, 5), ("resid_pre", 3, 10)])
def test_minilm_mary_john_matches_by_hand(kind, layer, unit):
    model = catalogue.load_model("minilm")
    pair = patching.prepare(model, patching.SAMPLE_CLEAN, patching.SAMPLE_CORRUPTED)
    clean, corrupted = (model.inputs(t)["ids"].tolist() for t in (patching.SAMPLE_CLEAN, patching.SAMPLE_CORRUPTED))
    with torch.no_grad():
        ref = sentence_embedding(model.net(input_ids=torch.tensor([clean])).hidden[0])
    assert pair.corrupted_diff < -1e-3          # swapping the names moves the embedding

    def measure(out):
        return -float((sentence_embedding(out.hidden[0]) - ref).norm())
    want = hand_diff(model, clean, corrupted, layer, kind, unit, None, None, measure)
    got = patching.patch_map(model, pair, kind, units={layer: [unit]})
    assert abs(float(got.diffs[layer, unit]) - want) < 1e-5
