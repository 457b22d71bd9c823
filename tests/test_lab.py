"""The lab's library: step-by-step recomputation equals the captured pattern, positional formulas,
permutation equivariance without positions, variant fidelity metrics, and clear bad-input errors."""
import math

import pytest
import torch
import torch.nn.functional as F
import transformers as tf

import attnviz
from attnviz.analysis import equivariance, head_recompute, position_tables, variant_fidelity
from attnviz.core.attention import Variant

VOCAB = 97


def tiny_hf(family: str):
    """Tiny random transformers models (offline), norms perturbed so nothing is an identity."""
    torch.manual_seed(0)
    if family == "bert":
        cfg = tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=37, max_position_embeddings=64)
        cls = tf.BertModel
    elif family == "gpt2":
        cfg = tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
        cls = tf.GPT2LMHeadModel
    else:
        cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             rope_theta=500.0)
        cls = tf.LlamaForCausalLM
    cfg._attn_implementation = "eager"
    hf = cls(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name.lower() or name.endswith("position_embeddings.weight"):
                p.add_(torch.randn_like(p) * 0.3)
    return attnviz.from_hf(hf)


@pytest.fixture(scope="module", params=["bert", "gpt2", "llama"])
def tiny(request):
    return tiny_hf(request.param)


@pytest.fixture(scope="module")
def minilm():
    return attnviz.load_model("minilm")


def ids(n=11, seed=1):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- step by step
def test_recomputation_equals_captured_pattern_tiny(tiny):
    assert head_recompute.verify(tiny, ids()) < 1e-5
    tr = tiny.trace(ids(), states=True)
    for layer in range(tiny.cfg.n_layers):
        for head in range(tiny.cfg.n_heads):
            r = head_recompute.head_steps(tiny, tr, layer, head, check_output=head == 0)
            assert torch.allclose(r.pattern, tr.attentions[layer, head], atol=1e-5) and not r.changed
        assert head_recompute.head_steps(tiny, tr, layer, 0).output_diff < 1e-5  # shares of W_O + b_O = output


def test_recomputation_equals_captured_pattern_minilm(minilm):
    assert head_recompute.verify(minilm, "The animal didn't cross the street because it was too tired.") < 1e-5


def test_steps_shapes_and_gqa(tiny):
    cfg = tiny.cfg
    tr = tiny.trace(ids(9), states=True)
    r = head_recompute.head_steps(tiny, tr, 1, 3)
    s = r.steps
    n, d, dh = 9, cfg.d_model, cfg.d_head
    assert s["input"].shape == (n, d) and s["W_Q"].shape == (d, dh) and s["Q"].shape == (n, dh)
    assert s["scores"].shape == s["softmax"].shape == (n, n)
    assert s["W_O"].shape == (dh, d) and s["output"].shape == (n, d)
    assert ("normed" in s) == cfg.pre_norm
    assert ("Q_rot" in s) == (cfg.positional == "rotary")
    assert r.kv_head == 3 // cfg.group  # GQA (llama: 2 query heads per K/V head)
    # the scaled step is the scores over sqrt(d_head), the weighted sum is A V
    assert torch.allclose(s["scaled"].value, s["scores"].value / math.sqrt(dh))
    assert torch.allclose(s["weighted"].value, s["softmax"].value @ s["V"].value, atol=1e-6)


def test_temperature_matches_the_temperature_variant(tiny):
    tr = tiny.trace(ids(), states=True)
    hot = tiny.trace(ids(), variants={1: Variant("softmax", temperature=2.5)})
    r = head_recompute.head_steps(tiny, tr, 1, 2, temperature=2.5)
    assert r.changed and r.max_abs_diff > 1e-4  # differs from what the unchanged model captured
    assert torch.allclose(r.pattern, hot.attentions[1, 2], atol=1e-5)


def test_mask_toggles():
    m = tiny_hf("bert")
    tr = m.trace(ids(8), states=True)
    r = head_recompute.head_steps(m, tr, 0, 1, causal=True, hidden_keys=(3, 5))
    A = r.pattern
    assert torch.all(A.triu(1) == 0) and torch.all(A[:, [3, 5]] == 0)
    assert torch.allclose(A.sum(-1), torch.ones(8))
    assert r.steps["mask"].value[2, 3] == 0 and r.steps["mask"].value[6, 4] == 1


def test_bad_input_messages():
    m = tiny_hf("gpt2")
    one = m.trace(ids(1), states=True)
    with pytest.raises(ValueError, match="at least two tokens"):
        head_recompute.head_steps(m, one, 0, 0)
    tr = m.trace(ids(), states=True)
    with pytest.raises(ValueError, match="head 12 is out of range.*0..3"):
        head_recompute.head_steps(m, tr, 0, 12)
    with pytest.raises(ValueError, match="layer 5 is out of range"):
        head_recompute.head_steps(m, tr, 5, 0)
    with pytest.raises(ValueError, match="states=True"):
        head_recompute.head_steps(m, m.trace(ids()), 0, 0)
    with pytest.raises(ValueError, match="no key at all"):
        head_recompute.head_steps(m, tr, 0, 0, hidden_keys=(0,))  # causal: query 0 sees only key 0
    pruned = m.prune(torch.tensor([[True, False, True, True], [True] * 4]))
    with pytest.raises(ValueError, match="pruned"):
        head_recompute.head_steps(pruned, pruned.trace(ids(), states=True), 0, 1)


# ---------------------------------------------------------------- positional encodings
def test_sinusoidal_formula():
    n, d = 50, 16
    pe = position_tables.sinusoidal_table(n, d)
    for p in (0, 7, 49):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_rope_similarity_depends_only_on_distance():
    n, dh, theta = 20, 8, 100.0
    sim = position_tables.rope_similarity(n, dh, theta)
    freqs = [theta ** (-2 * i / dh) for i in range(dh // 2)]
    for i, j in ((0, 0), (3, 7), (12, 5), (19, 0)):
        expect = sum(math.cos((i - j) * f) for f in freqs) / len(freqs)
        assert sim[i, j].item() == pytest.approx(expect, abs=1e-5)
    assert torch.allclose(sim.diagonal(4), sim.diagonal(4)[0].expand(n - 4), atol=1e-5)
    angles = position_tables.rope_angles(n, dh, theta)
    assert angles.shape == (n, dh // 2)
    assert angles[5, 0].item() == pytest.approx(5.0 - 2 * math.pi, abs=1e-4)  # wrapped to [-pi, pi]


def test_alibi_and_distance_helpers():
    bias = position_tables.alibi_table(6, 8)
    slopes = torch.tensor([2.0 ** -(k + 1) for k in range(8)])
    assert torch.allclose(bias[:, 5, 2], -3 * slopes)
    assert torch.all(bias[:, 2, 5] == 0)  # causal: the future carries no bias (it is masked anyway)
    assert torch.allclose(position_tables.by_distance(torch.eye(5)), torch.tensor([1.0, 0, 0, 0, 0]))
    sim = position_tables.cosine_similarity(torch.randn(7, 4))
    assert torch.allclose(sim.diagonal(), torch.ones(7), atol=1e-6)


def test_learned_table_is_minilm_positions(minilm):
    table = position_tables.learned_table(minilm)
    assert table.shape == (512, 384)
    assert torch.equal(table, minilm.net.pos.weight)
    assert position_tables.learned_table(tiny_hf("llama")) is None


# ---------------------------------------------------------------- permutation equivariance
def test_without_positions_shuffling_only_permutes_attention():
    m = tiny_hf("bert")
    plain = equivariance.permutation_test(equivariance.without_positions(m), ids(10), seed=3)
    assert sorted(plain.order) == list(range(10)) and plain.order != list(range(10))
    assert plain.max_diff < 1e-12 and plain.hidden_diff < 1e-12 and not plain.causal
    with_pos = equivariance.permutation_test(m, ids(10), order=plain.order)
    assert with_pos.max_diff > 1e-3


def test_permutation_minilm_keeps_specials_in_place(minilm):
    text = "The cat chased the small mouse across the garden."
    plain = equivariance.permutation_test(equivariance.without_positions(minilm), text)
    assert plain.order[0] == 0 and plain.order[-1] == len(plain.order) - 1  # [CLS] ... [SEP]
    assert plain.max_diff < 1e-12
    assert equivariance.permutation_test(minilm, text, order=plain.order).max_diff > 0.05


def test_causal_mask_alone_breaks_equivariance():
    m = equivariance.without_positions(tiny_hf("llama"))
    r = equivariance.permutation_test(m, ids(), seed=1)
    assert r.causal and r.max_diff > 1e-3
    with pytest.raises(ValueError, match="permutation"):
        equivariance.permutation_test(m, ids(), order=[0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9])


# ---------------------------------------------------------------- variants in a pretrained model
def test_variant_fidelity_lm_metrics():
    m = tiny_hf("gpt2")
    x = ids(12).tolist()
    same = variant_fidelity.variant_fidelity(m, x, "local:64", repeats=1)  # a window over everything: softmax
    assert same.kl == pytest.approx(0, abs=1e-6) and same.top1 == 1.0
    assert same.perplexity == pytest.approx(same.reference_perplexity, rel=1e-5)
    logits = m.trace(x, attentions=False).logits
    nll = F.cross_entropy(logits[:-1], torch.tensor(x[1:]))
    assert same.reference_perplexity == pytest.approx(math.exp(nll.item()), rel=1e-5)
    changed = variant_fidelity.variant_fidelity(m, x, {0: "linear", 1: "relu"}, repeats=1)
    assert changed.kl > 1e-6 and changed.perplexity != pytest.approx(changed.reference_perplexity, rel=1e-6)
    assert changed.seconds > 0 and changed.reference_seconds > 0 and changed.cosine is None


def test_variant_fidelity_encoder_cosine(minilm):
    text = "Attention lets every token look at every other token."
    same = variant_fidelity.variant_fidelity(minilm, text, "local:512", repeats=1)
    assert same.cosine == pytest.approx(1.0, abs=1e-5) and same.kl is None
    hot = variant_fidelity.variant_fidelity(minilm, text, {i: "temp:3" for i in range(6)}, repeats=1)
    assert 0 < hot.cosine < 0.999
    with pytest.raises(ValueError, match="outside"):
        variant_fidelity.variant_fidelity(minilm, text, {9: "linear"})


def test_loss_figure_gives_loss_and_accuracy_their_own_axes():
    """The accuracy axis was titled cross-entropy and log-scaled (update_yaxes hit both)."""
    from attnviz.figures import lab_figures
    fig = lab_figures.loss_figure([2.0, 1.0, 0.5, 0.1], [(2, 0.25), (4, 0.9)])
    loss_axis, acc_axis = fig.layout.yaxis, fig.layout.yaxis2
    assert loss_axis.type == "log" and "cross-entropy" in loss_axis.title.text
    assert acc_axis.type != "log" and acc_axis.title.text.startswith("exact accuracy")
    assert "cross-entropy" not in acc_axis.title.text
    assert tuple(acc_axis.range) == (0, 1.02) and acc_axis.tickformat == ".0%"
    assert acc_axis.overlaying == "y" and acc_axis.side == "right"
    assert [t.yaxis or "y" for t in fig.data] == ["y", "y2"]
    # without held-out measurements there is one log-scaled loss axis and no second one
    only_loss = lab_figures.loss_figure([2.0, 1.0])
    assert only_loss.layout.yaxis.type == "log" and "yaxis2" not in only_loss.layout.to_plotly_json()
