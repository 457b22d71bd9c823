"""Training-time experiments on toys (exact, seeded, a few steps each): the dropout variant acts
only in training, the variance term enters the loss, shared keys cut the parameter count exactly,
dynamic pruning masks heads, collapse and gradient concentration are measured exactly, and each
sentence follows its numbers."""
from dataclasses import replace

import pytest
import torch

import attnviz

from attnviz.analysis import gradient_heads
from attnviz.core.attention import Variant, parse_variant
from attnviz.core.transformer import Transformer
from attnviz.toys import head_measures, tasks, training, training_experiments

STEPS = 12


@pytest.fixture(scope="module")
def base():
    return training_experiments.run("baseline", STEPS, 0)


def test_dropout_variant_parses_and_acts_only_in_training():
    v = parse_variant("dropout:0.1")
    assert v == Variant("softmax", dropout=0.1) and v.name == "fused@drop=0.1" and parse_variant(v.name) == v
    assert parse_variant("local:8@T=2@drop=0.25") == Variant("local", window=8, temperature=2.0, dropout=0.25)
    with pytest.raises(ValueError, match="dropout"):
        parse_variant("dropout:1.5")
    with pytest.raises(ValueError, match="twice"):
        parse_variant("dropout:0.1@drop=0.2")
    s = training_experiments.settings_for(STEPS, 0)
    torch.manual_seed(0)
    net = Transformer(s.config())
    ids = s.task.sample(4, torch.Generator().manual_seed(0))[0]
    plain = net.eval()(input_ids=ids).logits
    assert torch.equal(net(input_ids=ids, variants=v).logits, plain)          # evaluation: no dropout
    net.train()
    torch.manual_seed(1)
    first = net(input_ids=ids, variants=v).logits
    torch.manual_seed(1)
    assert torch.equal(net(input_ids=ids, variants=v).logits, first)           # seeded
    assert (first - net(input_ids=ids).logits).abs().max() > 1e-3               # weights dropped


def test_a_penalty_enters_the_training_loss_exactly():
    s = training_experiments.settings_for(3, 0)
    plain = training.train(s).losses
    added = training.train(s, hooks=training.Hooks(penalty=lambda w: 0 * sum(x.sum() for x in w.values()) + 0.5))
    assert added.losses[0] == pytest.approx(plain[0] + 0.5, abs=1e-6)


def test_head_variance_and_the_regulariser(base):
    same = torch.full((1, 3, 4, 4), 0.25)
    assert float(training_experiments.head_variance({0: same})) == 0.0
    two = torch.zeros(1, 2, 1, 2)
    two[0, 0, 0] = torch.tensor([1.0, 0.0])
    two[0, 1, 0] = torch.tensor([0.0, 1.0])
    assert float(training_experiments.head_variance({0: two})) == pytest.approx(0.25)
    reg = training_experiments.run("variance", STEPS, 0)
    assert len(reg.penalties) == STEPS and all(p > 0 for p in reg.penalties)
    assert reg.losses[0] == pytest.approx(base.losses[0], abs=1e-6)   # the same first batch and network
    big = training_experiments.variance_regulariser(training_experiments.settings_for(STEPS, 0), weight=100.0)
    assert big.losses[-1] != pytest.approx(base.losses[-1], abs=1e-4)  # its gradient reaches the weights


def test_shared_keys_count_and_tie_the_key_projection(base):
    shared = training_experiments.run("shared_k", STEPS, 0)
    assert (shared.params, base.params) == (16_880, 18_464)
    assert "16,880 parameters instead of 18,464 (-8.6%)" in training_experiments.verdict(shared, base)
    s = training_experiments.settings_for(STEPS, 0)
    torch.manual_seed(0)
    net = Transformer(s.config())
    training_experiments.share_keys(net)
    assert training_experiments.trainable_params(net) == 16_880
    dh, h = s.config().d_head, s.n_heads
    k = net.blocks[0].attn.qkv.weight[h * dh: 2 * h * dh].detach()
    assert all(torch.equal(k[i * dh:(i + 1) * dh], k[:dh]) for i in range(h))
    training_experiments.unshare_keys(net)
    assert training_experiments.trainable_params(net) == 18_464 and torch.equal(
        net.blocks[0].attn.qkv.weight[h * dh: 2 * h * dh], k)


def test_dynamic_pruning_switches_heads_off_through_the_mask():
    s = training_experiments.settings_for(STEPS, 0)
    r = training_experiments.dynamic_pruning(s, threshold=1.0, patience=1, every=4, start=4)
    assert r.pruned and set(r.pruned.values()) <= {4, 8, 12}
    off = [(int(n[1]), int(n[3])) for n in r.pruned]
    assert all(r.head_mask[i, h] == 0 for i, h in off) and int((r.head_mask == 0).sum()) == len(off)
    assert (r.head_mask.sum(1) >= 1).all()                               # a layer keeps a head
    assert r.exact == tasks.evaluate(r.model, r.head_mask).exact           # evaluated under the mask
    assert r.concentration.heads == 8 - len(off) and float(r.concentration.gradient[off[0]]) == 0.0
    again = training_experiments.dynamic_pruning(s, threshold=1.0, patience=1, every=4, start=4)
    assert again.pruned == r.pruned and again.losses == r.losses         # seeded: exact reruns


def test_collapse_on_identity_attention():
    eye = torch.eye(5).expand(2, 3, 5, 5)                                # [L, H, n, n]
    c = head_measures.Collapse(head_measures.diagonal_mass(eye))
    assert c.count == 6 and c.names()[0] == "L0H0" and c.most() == ("L0H0", 1.0)
    mixed = eye.clone()
    mixed[1, 2] = torch.full((5, 5), 0.2)
    c = head_measures.Collapse(head_measures.diagonal_mass(mixed))
    assert c.count == 5 and float(c.diagonal[1, 2]) == pytest.approx(0.2)
    causal = torch.tril(torch.ones(4, 4))
    causal = (causal / causal.sum(-1, keepdim=True))[None, None]         # uniform over what is visible
    assert float(head_measures.diagonal_mass(causal, causal=True)) == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    assert "no head of 1 collapsed" in head_measures.collapse_sentence("x", head_measures.Collapse(
        head_measures.diagonal_mass(causal, causal=True)))
    assert "6 of 6 heads collapsed" in head_measures.collapse_sentence("x", head_measures.Collapse(
        head_measures.diagonal_mass(eye)))


def test_gradient_concentration_counts_and_says_whether_the_claim_holds():
    c = head_measures.concentration(torch.tensor([[0.9, 0.05], [0.05, 0.0]]))
    assert (c.needed, c.heads, c.claim_holds) == (1, 4, True)
    c = head_measures.concentration(torch.ones(2, 5))
    assert (c.needed, c.share, c.claim_holds) == (9, 0.9, False)
    assert "9 of 10 heads (90.0%)" in head_measures.concentration_sentence("toy", c)
    assert "does not hold" in head_measures.concentration_sentence("toy", c)
    assert " holds here" in head_measures.concentration_sentence(
        "toy", head_measures.concentration(torch.tensor([[1.0, 0.0, 0.0, 0.0]])))
    with pytest.raises(ValueError):
        head_measures.concentration(torch.zeros(2, 2))


def test_mask_gradient_of_a_tiny_toy_is_the_loss_slope():
    toy = tasks.load_toy("toy-copy")
    grad = head_measures.mask_gradient(toy, n=64)
    inputs, answers, _ = toy.task.sample(64, torch.Generator().manual_seed(tasks.EVAL_SEED))
    eps, (L, H) = 1e-2, grad.shape
    for layer, head in ((0, 0), (L - 1, H - 1)):
        up, down = torch.ones(L, H), torch.ones(L, H)
        up[layer, head], down[layer, head] = 1 + eps, 1 - eps
        with torch.inference_mode():
            lu = training.answer_loss(toy.net, toy.task, inputs, answers, toy.variant, up)[0]
            ld = training.answer_loss(toy.net, toy.task, inputs, answers, toy.variant, down)[0]
        assert float(grad[layer, head]) == pytest.approx(abs(float(lu - ld)) / (2 * eps), rel=0.05, abs=1e-4)
    c = head_measures.toy_concentration(toy, n=64)
    assert c.needed == head_measures.concentration(grad).needed and 1 <= c.needed <= L * H


def test_the_pretrained_measure_is_bounded_by_its_token_limit():
    minilm = attnviz.load_model("minilm")
    r = gradient_heads.pretrained_heads(minilm, max_tokens=16)
    assert (r.tokens, r.windows, r.total) == (14, 1, 1)                 # [CLS] + 14 tokens + [SEP]
    assert r.concentration.heads == r.collapse.heads == 72 and 1 <= r.concentration.needed <= 72
    assert "second-order" in r.measure and r.collapse.count == int((r.collapse.diagonal > 0.9).sum())
    with pytest.raises(ValueError, match="at least 8"):
        gradient_heads.pretrained_heads(minilm, max_tokens=4)


def test_experiments_are_exact_reruns_and_sentences_follow_the_numbers(base):
    hot = training_experiments.run("temp:2", STEPS, 0)
    assert training_experiments.run("temp:2", STEPS, 0).losses == hot.losses
    assert hot.losses != base.losses and [step for step, _ in hot.history] == [10]
    worse, same, better = (replace(base, name="dropout", exact=base.exact + d) for d in (-0.1, 0.001, 0.1))
    assert "it did not help" in training_experiments.verdict(worse, base)
    assert "no measurable effect" in training_experiments.verdict(same, base)
    assert "it helped" in training_experiments.verdict(better, base)
    with pytest.raises(ValueError):
        training_experiments.verdict(replace(base, seed=1), base)
    with pytest.raises(ValueError, match="unknown experiment"):
        training_experiments.run("nope", STEPS, 0)
    with pytest.raises(ValueError, match="steps"):
        training_experiments.run("baseline", 0, 0)
