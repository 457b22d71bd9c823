"""Translation patching against patching done by hand: module hooks copy the clean source's
activation into a teacher-forced `trace` of the corrupted source (the model's public path, no
per-call patch), and the logit difference is read from its log-probabilities."""
import pytest
import torch

from attnviz.analysis import patching_translate
from attnviz.weights import catalogue


@pytest.fixture(scope="module")
def en_pt():
    return catalogue.load_model("en-pt")


@pytest.fixture(scope="module")
def pair(en_pt):
    return patching_translate.prepare(en_pt, patching_translate.SAMPLE_CLEAN, patching_translate.SAMPLE_CORRUPTED)


def hand_diff(model, pair, kind, layer, unit):
    """logit[target] - logit[minus] at the scored position, one activation copied BY HAND."""
    net = model.net
    module = net.decoder[layer].cross.out if kind == "cross" else net.encoder[layer]
    d_head = model.cfg.d_head
    cols = slice(unit * d_head, (unit + 1) * d_head)
    kept = {}
    prefix = pair.feed[0, 1:].tolist()

    def grab(mod, args):
        kept["x"] = args[0].clone()

    def put(mod, args):
        x = args[0].clone()
        if kind == "cross":
            x[..., cols] = kept["x"][..., cols]
        else:
            x[:, unit] = kept["x"][:, unit]
        return (x,) + tuple(args[1:])

    clean, corrupted = patching_translate.SAMPLE_CLEAN, patching_translate.SAMPLE_CORRUPTED
    handle = module.register_forward_pre_hook(grab)
    model.trace(clean, target=prefix + [pair.target])
    handle.remove()
    handle = module.register_forward_pre_hook(put)
    try:
        logp = [float(model.trace(corrupted, target=prefix + [tok]).logprobs[len(prefix)])
                for tok in (pair.target, pair.minus)]
    finally:
        handle.remove()
    return logp[0] - logp[1]          # a difference of log-probabilities is the logit difference


def test_the_pair_parts_where_the_translations_do(en_pt, pair):
    assert pair.clean_text == "O gato preto dorme no sofá." and pair.corrupted_text.startswith("O cão")
    assert (pair.prefix, pair.target_label, pair.minus_label) == ([" O"], " gato", " cão")
    assert pair.clean_diff > 0 > pair.corrupted_diff
    t = en_pt.trace(patching_translate.SAMPLE_CORRUPTED, target=[pair.feed[0, 1].item(), pair.minus])
    assert int(t.top_ids[1, 0]) == pair.minus        # the corrupted source's own choice there


@pytest.mark.parametrize("kind", ["cross", "enc_resid"])
def test_maps_match_patching_by_hand(en_pt, pair, kind):
    got = patching_translate.patch_map(en_pt, pair, kind)
    c = en_pt.cfg
    rows, cols = (c.n_dec_layers, c.n_heads) if kind == "cross" else (c.n_enc_layers, len(pair.source_tokens))
    assert got.recovered.shape == (rows, cols) and torch.isfinite(got.recovered).all()
    for layer, unit in [(0, 0), (rows - 1, 2), (1, cols - 1), *[(r, u) for r, u, _ in got.top(3)]]:
        want = hand_diff(en_pt, pair, kind, layer, unit)
        assert abs(float(got.diffs[layer, unit]) - want) < 1e-4
    if kind == "enc_resid":   # the swapped word's position at block 0 is the whole clean source
        assert float(got.recovered[0, 2]) == pytest.approx(1.0, abs=1e-5)
        assert float(got.recovered[0, 0]) == pytest.approx(0.0, abs=1e-5)


def test_refusals(en_pt):
    with pytest.raises(ValueError, match="same length"):
        patching_translate.prepare(en_pt, "The black cat sleeps.", "The cat sleeps.")
    with pytest.raises(ValueError, match="the same"):
        patching_translate.prepare(en_pt, "The cat sleeps.", "The cat sleeps.")
    with pytest.raises(ValueError, match="not a text translator"):
        patching_translate.prepare(catalogue.load_model("minilm"), "a b", "a c")
    pair = patching_translate.prepare(en_pt, patching_translate.SAMPLE_CLEAN, patching_translate.SAMPLE_CORRUPTED)
    with pytest.raises(ValueError, match="unknown activation"):
        patching_translate.patch_map(en_pt, pair, "mlp")
