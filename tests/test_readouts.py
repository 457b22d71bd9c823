"""Logit lens, direct logit attribution, mean ablation and prompt pairs, each against an
independent computation (the model's own logits, forward hooks on a private model, hand sums)."""
import math

import pytest
import torch

from attnviz.analysis import head_ablation, prompt_pair, readouts
from attnviz.base import exports
from attnviz.core.config import Config
from attnviz.weights.catalogue import random_model
from tests.tiny import BERT, LLAMA

GPT2 = Config(family="gpt2", task="lm", n_layers=3, n_heads=4, n_kv_heads=4, d_model=32, d_head=8, d_ff=64,
              vocab_size=50, max_positions=64, norm_eps=1e-5, causal=True, pre_norm=True,
              activation="gelu_tanh")
IDS = [3, 17, 5, 42, 8, 8, 21, 30, 2]


def randomised_norms(model):
    """Random final-norm and block-norm parameters (a fresh model starts at weight 1, bias 0)."""
    g = torch.Generator().manual_seed(1)
    for module in model.net.modules():
        if isinstance(module, torch.nn.LayerNorm) or type(module).__name__ == "RMSNorm":
            module.weight.data = 1 + 0.3 * torch.randn(module.weight.shape, generator=g)
            if getattr(module, "bias", None) is not None:
                module.bias.data = 0.2 * torch.randn(module.bias.shape, generator=g)
    model.net.pack()
    return model


@pytest.fixture(params=["llama", "gpt2"])
def lm(request):
    return randomised_norms(random_model(LLAMA if request.param == "llama" else GPT2, seed=3))


# ---------------------------------------------------------------- logit lens
def test_lens_last_row_is_the_models_logits(lm):
    tr = lm.trace(IDS, attentions=False)
    run = readouts.run(lm, IDS)
    assert len(run.states) == lm.cfg.n_layers + 1
    torch.testing.assert_close(readouts.lens_logits(lm, run.states[-1]), tr.logits, atol=1e-5, rtol=1e-5)
    lens = readouts.logit_lens(lm, IDS)
    probs = tr.logits.softmax(-1)
    assert lens.final_ids.tolist() == tr.logits.argmax(-1).tolist()
    torch.testing.assert_close(lens.top_probs[-1], probs.topk(readouts.TOP_K, -1).values, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(lens.final_probs[-1], probs.max(-1).values, atol=1e-5, rtol=1e-4)
    assert lens.rows[0] == "embed" and lens.rows[-1] == f"L{lm.cfg.n_layers - 1} out"


def test_lens_middle_row_is_norm_and_unembedding_of_that_residual(lm):
    """Row i + 1 = the final norm and the LM head applied by hand to the model's own block-i output."""
    tr = lm.trace(IDS, attentions=False, states=True)
    lens = readouts.logit_lens(lm, IDS)
    net = lm.net
    for row in (0, 1, 2):
        h = tr.states[row]
        by_hand = torch.nn.functional.linear(net.norm(h), net.lm_head.weight, net.lm_head.bias).softmax(-1)
        torch.testing.assert_close(lens.top_probs[row, :, 0], by_hand.max(-1).values, atol=1e-5, rtol=1e-4)
        assert lens.top_ids[row, :, 0].tolist() == by_hand.argmax(-1).tolist()
    first = lens.first_top1(int(lens.final_ids[-1]))
    assert first is not None and first <= lm.cfg.n_layers


def test_lens_frame_and_cell(lm):
    lens = readouts.logit_lens(lm, IDS)
    frame = readouts.lens_frame(lens)
    assert len(frame) == (lm.cfg.n_layers + 1) * len(IDS)
    assert set(frame.columns) >= {"layer", "position", "token", "top_token", "top_prob", "final_prediction_prob"}
    cell = readouts.cell_top(lens, 2, 4)
    assert len(cell) == readouts.TOP_K and cell["probability"].is_monotonic_decreasing
    assert exports.csv_text(frame).startswith("layer,position")


# ---------------------------------------------------------------- direct logit attribution
@pytest.mark.parametrize("minus", [None, 7])
def test_attribution_sums_to_the_logit_difference(lm, minus):
    att = readouts.attribution(lm, IDS, target=11, minus=minus)
    logits = lm.trace(IDS, attentions=False).logits[-1]
    real = float(logits[11] - (logits[minus] if minus is not None else 0))
    assert att.logit_diff == pytest.approx(real, abs=1e-5)
    assert att.total == pytest.approx(real, abs=1e-4)
    assert att.heads.shape == (lm.cfg.n_layers, lm.cfg.n_heads) and att.mlps.shape == (lm.cfg.n_layers,)


def test_attribution_heads_match_hand_computed_head_outputs():
    """Each head's output recomputed from the captured attention weights and the V projection."""
    lm = randomised_norms(random_model(LLAMA, seed=5))
    tr = lm.trace(IDS, states=True)
    att = readouts.attribution(lm, IDS, target=4, minus=9)
    net, cfg = lm.net, lm.cfg
    x = net.blocks[-1](tr.states[cfg.n_layers - 1][None], rope=net.rope(len(IDS)), causal=True)[0][0, -1]  # states end normed
    scale = 1 / math.sqrt(float(x.pow(2).mean()) + net.norm.eps)
    direction = net.lm_head.weight[4] - net.lm_head.weight[9]
    for i, block in enumerate(net.blocks):
        h_in = block.norm1(tr.states[i])                                      # (n, d)
        _, _, v = block.attn.qkv(h_in).split([cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head,
                                              cfg.n_kv_heads * cfg.d_head], -1)
        v = v.view(len(IDS), cfg.n_kv_heads, cfg.d_head)
        for h in range(cfg.n_heads):
            z = tr.attentions[i, h, -1] @ v[:, h // cfg.group]              # (dh,)
            out = block.attn.out.weight[:, h * cfg.d_head:(h + 1) * cfg.d_head] @ z
            assert float(att.heads[i, h]) == pytest.approx(float((net.norm.weight * out * scale) @ direction),
                                                           abs=1e-5)


def test_attribution_with_a_mask_and_frame():
    lm = random_model(LLAMA, seed=2)
    mask = torch.ones(3, 4)
    mask[1, 2] = 0
    att = readouts.attribution(lm, IDS, 1, 2, head_mask=mask)
    assert float(att.heads[1, 2]) == 0.0
    logits = lm.trace(IDS, head_mask=mask, attentions=False).logits[-1]
    assert att.total == pytest.approx(float(logits[1] - logits[2]), abs=1e-4)
    frame = readouts.attribution_frame(att)
    assert len(frame) == 3 * 4 + 3 + 2 and frame["contribution"].sum() == pytest.approx(att.total, abs=1e-4)
    top = att.top_heads(3)
    assert [c for _, _, c in top] == sorted([c for _, _, c in top], reverse=True)
    keep = readouts.top_off_mask(att, 3)
    assert int((keep == 0).sum()) == 3 and all(keep[i, h] == 0 for i, h, _ in top)


def test_readouts_refuse_bad_input(set_limits):
    with pytest.raises(ValueError, match="not a language model"):
        readouts.logit_lens(random_model(BERT), IDS)
    lm = random_model(LLAMA)
    with pytest.raises(ValueError, match="vocabulary"):
        readouts.attribution(lm, IDS, target=50)
    with pytest.raises(ValueError, match="same"):
        readouts.attribution(lm, IDS, target=3, minus=3)
    set_limits(readout_max_tokens=4)
    with pytest.raises(ValueError, match="at most 4"):
        readouts.logit_lens(lm, IDS)


# ---------------------------------------------------------------- ablation
def hooked_logits(model, ids, replace: dict):
    """Logits with head outputs replaced BY HAND: a pre-hook on each layer's output projection
    overwrites the head's slice of its input ({(layer, head): vector [d_head]})."""
    dh = model.cfg.d_head
    handles = []
    for layer in {i for i, _ in replace}:
        def hook(module, args, layer=layer):
            y = args[0].clone()
            for (i, h), vec in replace.items():
                if i == layer:
                    y[..., h * dh:(h + 1) * dh] = vec
            return (y,)
        handles.append(model.net.blocks[layer].attn.out.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            return model.net(input_ids=torch.tensor([ids])).logits[0]
    finally:
        for handle in handles:
            handle.remove()


def test_mean_ablation_equals_replacing_head_outputs_by_hand():
    lm = random_model(LLAMA, seed=4)
    data = torch.tensor([5, 9, 13, 2, 44, 7, 7, 30, 12, 1, 3, 28])
    means = head_ablation.head_means(lm, data)
    assert means.shape == (3, 4, 8)
    mask = torch.ones(3, 4)
    off = [(0, 1), (2, 3), (2, 0)]
    for i, h in off:
        mask[i, h] = 0
    got = head_ablation.logits(lm, IDS, mask, "mean", means)
    want = hooked_logits(lm, IDS, {(i, h): means[i, h] for i, h in off})
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    zero = head_ablation.logits(lm, IDS, mask, "zero")
    torch.testing.assert_close(zero, hooked_logits(lm, IDS, {(i, h): torch.zeros(8) for i, h in off}),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(zero, lm.trace(IDS, head_mask=mask, attentions=False).logits, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, zero)


def test_head_means_are_means_of_the_head_outputs():
    """The mean of a head's output over positions, recomputed from the attention weights and V."""
    lm = random_model(LLAMA, seed=6)
    data = [4, 8, 15, 16, 23, 42, 1, 2]
    means = head_ablation.head_means(lm, torch.tensor(data))
    tr = lm.trace(data, states=True)
    cfg, block = lm.cfg, lm.net.blocks[1]
    _, _, v = block.attn.qkv(block.norm1(tr.states[1])).split([32, 16, 16], -1)
    v = v.view(len(data), 2, 8)
    for h in range(4):
        torch.testing.assert_close(means[1, h], (tr.attentions[1, h] @ v[:, h // cfg.group]).mean(0),
                                   atol=1e-5, rtol=1e-5)


def test_ablation_modes_refuse_bad_input():
    lm = random_model(LLAMA)
    with pytest.raises(ValueError, match="zero, mean"):
        head_ablation.logits(lm, IDS, torch.ones(3, 4), "half")
    with pytest.raises(ValueError, match="means"):
        head_ablation.logits(lm, IDS, torch.ones(3, 4), "mean", None)
    assert "mean" in head_ablation.describe("mean") and "zero" in head_ablation.describe("zero")


# ---------------------------------------------------------------- two prompts
@pytest.fixture(scope="module")
def smollm2():
    import attnviz
    return attnviz.load_model("smollm2")


TROPHY = "The trophy didn't fit in the suitcase because it was too "


def test_pair_of_equal_length_is_the_row_distance_by_hand(smollm2):
    pair = prompt_pair.compare_prompts(smollm2, TROPHY + "big", TROPHY + "small")
    assert not pair.by_word and pair.note is None
    a, b = (smollm2.trace(TROPHY + w).attentions for w in ("big", "small"))
    want = torch.zeros(30, 9)
    for i in range(30):
        for h in range(9):
            want[i, h] = sum(0.5 * float((a[i, h, q] - b[i, h, q]).abs().sum()) for q in range(a.shape[-1])) / a.shape[-1]
    torch.testing.assert_close(pair.difference, want, atol=1e-5, rtol=1e-4)
    # causal: only the last row can differ, and it differs in some head
    assert pair.difference.max() > 0.01
    assert len(prompt_pair.difference_frame(pair)) == 270


def test_pair_of_different_lengths_is_aligned_by_word(smollm2):
    pair = prompt_pair.compare_prompts(smollm2, TROPHY + "big", "The golden trophy didn't fit in the suitcase because it was too big")
    assert pair.by_word and "word by word" in pair.note and "1 word" in pair.note
    assert pair.words[0][:3] == ["The", "trophy", "didn't"] and pair.words[1][1] == "golden"
    assert (1, 2) in pair.matched and all(j != 1 for _, j in pair.matched)
    assert pair.word_of[0][2:4] == [2, 2]  # " didn" + "'t": one word
    assert ((pair.difference >= 0) & (pair.difference <= 1 + 1e-5)).all()


def test_pair_checks_its_limits_before_tracing_either_prompt(set_limits, monkeypatch):
    """Readouts › Two prompts: both prompts were traced (every layer's [H, n, n]) before the limit was
    checked; 8,192 tokens asked torch for one 72 GB buffer and raised RuntimeError."""
    lm = random_model(LLAMA)
    traced = []
    real = lm.trace
    monkeypatch.setattr(lm, "trace", lambda *a, **k: traced.append(1) or real(*a, **k))
    set_limits(readout_max_tokens=8)
    with pytest.raises(ValueError, match="two prompts take at most 8 each") as err:
        prompt_pair.compare_prompts(lm, IDS[:5], IDS)
    assert not traced and "the second prompt has 9 tokens" in str(err.value)
    set_limits(readout_max_tokens=256, max_capture_mb=0)   # the one capture estimate refuses before tracing
    with pytest.raises(ValueError, match="two prompts of 9 tokens would hold .* Shorten each prompt"):
        prompt_pair.compare_prompts(lm, IDS[:5], IDS)
    assert not traced
    set_limits(max_capture_mb=512)
    assert prompt_pair.compare_prompts(lm, IDS[:5], IDS).difference.shape == (3, 4) and len(traced) == 2


def test_pool_words_by_hand():
    att = torch.tensor([[[[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]]]])     # (1, 1, 3, 3)
    pooled = prompt_pair.pool_words(att, [0, 1, 1], 2)
    torch.testing.assert_close(pooled[0, 0], torch.tensor([[1.0, 0.0], [0.35, 0.65]]))
    assert prompt_pair.align(["a", "b", "c"], ["a", "x", "b", "c"]) == ([(0, 0), (1, 2), (2, 3)], 1)


# ---------------------------------------------------------------- attention sinks
def test_artefact_share_and_sink_role():
    from attnviz.analysis import stats
    g = torch.Generator().manual_seed(0)
    attn = torch.rand(2, 3, 6, 6, generator=g).softmax(-1)
    attn[1, 2, :, 4] += 20                                            # head L1H2 dumps its weight on token 4
    attn = attn / attn.sum(-1, keepdim=True)
    marked = torch.tensor([False, False, False, False, True, False])
    table = stats.head_stats(attn, artefacts=marked)
    row = table[(table["layer"] == 1) & (table["head"] == 2)].iloc[0]
    assert row["artefact_share"] == pytest.approx(float(attn[1, 2, :, 4].mean()), abs=1e-6)
    assert row["role"] == "sink"
    assert math.isnan(stats.head_stats(attn).loc[0, "artefact_share"])
    assert table["first_share"].iloc[0] == pytest.approx(float(attn[0, 0, :, 0].mean()), abs=1e-6)


def test_rollout_with_artefact_tokens_discounted():
    from attnviz.analysis import stats, vision
    from attnviz.core.model import Trace
    g = torch.Generator().manual_seed(1)
    attn = torch.rand(3, 2, 5, 5, generator=g).softmax(-1)            # CLS + a 2 x 2 grid
    tr = Trace(tokens=["CLS", "p0,0", "p0,1", "p1,0", "p1,1"], attentions=attn, hidden=torch.zeros(5, 4),
               logits=None, grid=(2, 2), n_prefix=1)
    flags = torch.tensor([[False, True], [False, False]])
    drop = vision.artefact_tokens(tr, vision.Artefacts(0, torch.ones(2, 2), flags, 1.0, 0.0, 1.0, 3.0))
    assert drop.tolist() == [False, False, True, False, False]
    by_hand = attn.clone()
    by_hand[..., 2] = 0
    by_hand = by_hand / by_hand.sum(-1, keepdim=True)
    torch.testing.assert_close(vision.discount_tokens(attn, drop), by_hand)
    want = stats.rollout(by_hand)[0, 1:].reshape(2, 2)
    torch.testing.assert_close(vision.rollout_map(tr, discount=drop), want)
    assert float(vision.rollout_map(tr, discount=drop)[0, 1]) == 0.0


# ---------------------------------------------------------------- mean ablation in effects, importance, pruning
def test_mean_ablation_in_the_live_effect_equals_the_hand_replaced_logits():
    from attnviz.analysis import effects
    lm = random_model(LLAMA, seed=4)
    means = head_ablation.head_means(lm, torch.tensor([5, 9, 13, 2, 44, 7, 7, 30, 12, 1]))
    mask = torch.ones(3, 4)
    mask[1, 1] = mask[2, 3] = 0
    full = effects.outputs(lm, IDS)
    zero = effects.outputs(lm, IDS, mask, base=full)
    mean = effects.outputs(lm, IDS, mask, base=[full, zero], ablation="mean", means=means)
    assert mean.ablation == "mean" and zero.ablation == "zero"
    want = hooked_logits(lm, IDS, {(1, 1): means[1, 1], (2, 3): means[2, 3]}).log_softmax(-1)
    torch.testing.assert_close(mean.logprobs, want, atol=1e-5, rtol=1e-5)
    assert mean.start == 1  # started from the full run's layer-1 input, not from the zero-ablated run
    again = effects.outputs(lm, IDS, mask, base=[full, mean], ablation="mean", means=means)
    assert again is mean  # the same mask and ablation: nothing to compute


def test_mean_ablation_for_an_encoder_live_effect():
    from attnviz.analysis import effects
    enc = random_model(BERT, seed=2)
    means = head_ablation.head_means(enc, torch.tensor([1, 5, 9, 2, 7, 3]))
    mask = torch.ones(2, 4)
    mask[0, 2] = 0
    out = effects.outputs(enc, IDS, mask, sentences=["x"], ablation="mean", means=means) \
        if enc.tokenizer is not None else effects.outputs(enc, IDS, mask, ablation="mean", means=means)
    zero = effects.outputs(enc, IDS, mask)
    assert out.ablation == "mean" and not torch.allclose(out.embedding, zero.embedding)


def test_importance_and_pruning_curve_under_mean_ablation():
    from attnviz.analysis import importance, pruning
    lm = random_model(LLAMA, seed=8)
    data = importance.EvalSet(torch.tensor([[3, 17, 5, 42, 8, 8, 21, 30], [1, 2, 3, 4, 5, 6, 7, 8]]), 16, 16)
    means = head_ablation.head_means(lm, torch.tensor([9, 8, 7, 6, 5, 4, 3, 2, 1]))
    mask = torch.ones(3, 4)
    mask[0, 0] = 0
    metrics = importance.evaluate(lm, data, mask, ablation="mean", means=means)
    nll = 0.0
    for row in data.ids:
        lp = hooked_logits(lm, row.tolist(), {(0, 0): means[0, 0]}).log_softmax(-1)
        nll += float(-lp[:-1].gather(-1, row[1:, None]).sum())
    assert metrics["loss"] == pytest.approx(nll / 14, abs=1e-5)
    assert metrics["loss"] != pytest.approx(importance.evaluate(lm, data, mask)["loss"], abs=1e-6)
    grad = importance.head_importance(lm, data, "gradient", ablation="mean", means=means)
    abl = importance.head_importance(lm, data, "ablation", ablation="mean", means=means)
    assert grad.ablation == abl.ablation == "mean" and torch.isfinite(grad.raw).all()
    one = mask.clone()
    one[0, 0] = 1
    one[2, 1] = 0
    rise = importance.evaluate(lm, data, one, ablation="mean", means=means)["loss"] - abl.baseline["loss"]
    assert float(abl.raw[2, 1]) == pytest.approx(rise, abs=1e-5)
    curve = pruning.pruning_curve(lm, data, step=0.25, max_fraction=0.5, seeds=(0,), ablation="mean", means=means)
    assert curve.ablation == "mean" and curve.complete
    keep = curve.masks[("random", 0, 0.25)]
    row = curve.table[(curve.table["order"] == "random") & (curve.table["fraction"] == 0.25)].iloc[0]
    assert row["loss"] == pytest.approx(importance.evaluate(lm, data, keep.float(), ablation="mean",
                                                            means=means)["loss"], abs=1e-6)
