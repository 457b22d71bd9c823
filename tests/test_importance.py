"""Head importance, pruning curves and speed-up bookkeeping on tiny models with known answers."""
import math

import pytest
import torch

from attnviz.core.config import Config
from attnviz.analysis.importance import (EvalSet, ablation_importance, eval_windows, evaluate, gradient_importance,
                                keep_top, normalise_per_layer, reference)
from attnviz.weights.catalogue import random_model
from attnviz.analysis.pruning import pruning_curve
from attnviz.latency.speedup import forward_flops, measure_speedup

SIGNAL = (1, 2)  # the one head that carries everything in the toy models


def lm_config(n_kv=4):
    return Config(family="llama", task="lm", n_layers=2, n_heads=4, n_kv_heads=n_kv, d_model=32, d_head=8,
                  d_ff=64, vocab_size=40, max_positions=64, norm="rmsnorm", norm_eps=1e-6,
                  positional="rotary", causal=True, pre_norm=True, activation="silu", gated_mlp=True,
                  qkv_bias=False, out_bias=False, mlp_bias=False)


def bert_config():
    return Config(family="bert", task="encoder", n_layers=2, n_heads=4, n_kv_heads=4, d_model=32, d_head=8, d_ff=64,
                  vocab_size=40, max_positions=64, type_vocab_size=2, embedding_norm=True, final_norm=False)


def one_head_model(cfg):
    """Every head's output-projection columns are zero except SIGNAL's, which is boosted."""
    model = random_model(cfg, seed=1)
    dh = cfg.d_head
    for i, block in enumerate(model.net.blocks):
        w = block.attn.out.weight
        for h in range(cfg.n_heads):
            cols = slice(h * dh, (h + 1) * dh)
            with torch.no_grad():  # in place on the parameter: the packed copy sees the change
                w[:, cols] = w[:, cols] * 4 if (i, h) == SIGNAL else 0
    return model


def data(cfg, windows=3, n=12, seed=0):
    ids = torch.randint(0, cfg.vocab_size, (windows, n), generator=torch.Generator().manual_seed(seed))
    return EvalSet(ids=ids, n_tokens=ids.numel(), available=ids.numel())


@pytest.mark.parametrize("cfg", [lm_config(), bert_config()], ids=["lm", "encoder"])
@pytest.mark.parametrize("method", ["gradient", "ablation"])
def test_the_head_that_carries_the_signal_ranks_first(cfg, method):
    model, d = one_head_model(cfg), data(cfg)
    fn = gradient_importance if method == "gradient" else ablation_importance
    imp = fn(model, d)
    assert imp.complete and imp.done == imp.total
    for normalised in (True, False):
        table = imp.table(normalised)
        assert (table.loc[0, "layer"], table.loc[0, "head"]) == SIGNAL
        assert table.loc[0, "score"] > 0
        assert imp.keep_top(1 / 8, normalised=normalised)[SIGNAL]
    others = imp.raw.clone()
    others[SIGNAL] = 0
    # a head whose output projection is zero changes nothing: its score is exactly zero
    assert torch.allclose(others, torch.zeros_like(others), atol=1e-7)
    if method == "gradient":  # Michel et al.: per-layer L2 normalisation
        assert torch.allclose(imp.scores[SIGNAL[0]].norm(), torch.tensor(1.0))


def test_encoder_gradient_score_estimates_the_ablation_effect():
    """At m = 1 the encoder score is the second-order estimate of the rise of 1 - cos; with all
    d probes it is exact up to third-order terms, so it is close to the measured ablation effect."""
    cfg = bert_config()
    model, d = one_head_model(cfg), data(cfg)
    grad = gradient_importance(model, d, probes=cfg.d_model)
    abl = ablation_importance(model, d)
    est, real = float(grad.raw[SIGNAL]), float(abl.raw[SIGNAL])
    assert real > 0 and 0.3 < est / real < 3


def test_lm_gradient_score_is_mean_absolute_gradient():
    cfg = lm_config()
    model, d = random_model(cfg, seed=3), data(cfg, windows=2)
    imp = gradient_importance(model, d)
    expected = torch.zeros(cfg.n_layers, cfg.n_heads)
    for w in range(2):
        mask = torch.ones(cfg.n_layers, cfg.n_heads, requires_grad=True)
        logits = model.net(input_ids=d.ids[w:w + 1], head_mask=mask).logits[0]
        torch.nn.functional.cross_entropy(logits[:-1], d.ids[w, 1:]).backward()
        expected += mask.grad.abs() / 2
    assert torch.allclose(imp.raw, expected, atol=1e-6)
    assert torch.allclose(imp.scores, normalise_per_layer(expected), atol=1e-6)


@pytest.mark.parametrize("cfg", [lm_config(n_kv=2), bert_config()], ids=["gqa-lm", "encoder"])
def test_masked_outputs_equal_pruned_outputs(cfg):
    model, d = random_model(cfg, seed=2), data(cfg, windows=2)
    keep = torch.tensor([[True, False, True, True], [False, False, True, False]])
    small = model.prune(keep)
    with torch.inference_mode():
        masked = model.net(input_ids=d.ids, head_mask=keep.float())
        pruned = small.net(input_ids=d.ids)
    assert torch.allclose(masked.hidden, pruned.hidden, atol=1e-5)
    if masked.logits is not None:
        assert torch.allclose(masked.logits, pruned.logits, atol=1e-5)
    full_ref = reference(model, d)
    m_masked = evaluate(model, d, keep.float(), full_ref)
    m_pruned = evaluate(small, d, None, full_ref)
    for key, value in m_masked.items():
        assert m_pruned[key] == pytest.approx(value, rel=1e-4, abs=1e-6)


def test_evaluate_full_model_agrees_with_itself():
    cfg = lm_config()
    model, d = random_model(cfg), data(cfg)
    m = evaluate(model, d)
    assert m["top1"] == 1.0 and abs(m["kl"]) < 1e-3
    assert m["perplexity"] == pytest.approx(math.exp(m["loss"]))


@pytest.mark.parametrize("cfg", [lm_config(), bert_config()], ids=["lm", "encoder"])
def test_pruning_curve_bookkeeping(cfg):
    model, d = random_model(cfg), data(cfg, windows=2)
    curve = pruning_curve(model, d, step=0.25, max_fraction=0.75, seeds=(0, 1), normalised=cfg.task == "lm")
    assert curve.complete and curve.total == 4 * 3
    t = curve.table
    assert len(t) == 12 and set(t["order"]) == {"importance", "random"}
    for (order, seed), run in t.groupby(["order", "seed"]):
        assert run["fraction"].tolist() == [0.0, 0.25, 0.5, 0.75]
        assert run["removed"].tolist() == [0, 2, 4, 6]  # 8 heads, steps of 25%
    imp_masks = [curve.masks[("importance", -1, f)] for f in (0.0, 0.25, 0.5, 0.75)]
    for before, after in zip(imp_masks, imp_masks[1:]):
        assert torch.all(after <= before)  # a removed head stays removed
    start = t[t["fraction"] == 0]
    metric = "top1" if cfg.task == "lm" else "cosine"
    assert start[metric].tolist() == pytest.approx([1.0] * 3)
    s = curve.summary()
    assert set(s["runs"]) == {1, 2}
    assert (s[s["order"] == "random"]["runs"] == 2).all()
    assert f"{curve.metric}_mean" in s and f"{curve.metric}_std" in s


def test_cancelled_runs_return_partial_results():
    cfg = lm_config()
    model, d = one_head_model(cfg), data(cfg, windows=4)
    calls = []
    stop_after = lambda n: (lambda: len(calls) >= n)  # noqa: E731
    record = lambda done, total, partial: calls.append((done, total))  # noqa: E731
    g = gradient_importance(model, d, progress=record, should_stop=stop_after(2))
    assert not g.complete and (g.done, g.total) == (2, 4)
    assert not torch.isnan(g.scores).any()
    calls.clear()
    a = ablation_importance(model, d, progress=record, should_stop=stop_after(3))
    assert not a.complete and a.done == 3 and a.total == 8
    assert int((~torch.isnan(a.scores)).sum()) == 3 and len(a.table()) == 3
    calls.clear()
    c = pruning_curve(model, d, step=0.5, max_fraction=0.5, seeds=(0,), progress=record,
                      should_stop=stop_after(3))
    assert not c.complete and len(c.table) == 3 == c.done


def test_keep_top_and_masked_heads():
    scores = torch.tensor([[0.1, 0.9, float("nan")], [0.5, 0.2, 0.3]])
    keep = keep_top(scores, 0.4)
    assert keep.tolist() == [[False, True, False], [True, False, False]]
    with pytest.raises(ValueError, match="compute importance"):
        keep_top(torch.full((2, 2), float("nan")), 0.5)
    cfg = lm_config()
    model, d = random_model(cfg), data(cfg, windows=1)
    mask = torch.ones(2, 4)
    mask[0, 1] = 0
    imp = gradient_importance(model, d, head_mask=mask)
    assert torch.isnan(imp.scores[0, 1]) and int(torch.isnan(imp.scores).sum()) == 1


def test_eval_windows_on_a_real_tokenizer(minilm):
    d = eval_windows(minilm, None, max_tokens=300, window=64)
    assert d.ids.shape == (300 // 62, 64)
    cls, sep = minilm.tokenizer.cls_token_id, minilm.tokenizer.sep_token_id
    assert (d.ids[:, 0] == cls).all() and (d.ids[:, -1] == sep).all()
    short = eval_windows(minilm, "The cat sat on the mat.", max_tokens=300, window=64)
    assert short.n_windows == 1 and short.ids.shape[1] == short.n_tokens + 2
    for bad in ("", "   ", "cat"):
        with pytest.raises(ValueError, match="at least two|empty"):
            eval_windows(minilm, bad)


def test_speedup_bookkeeping():
    cfg = lm_config(n_kv=2)
    model = random_model(cfg)
    keep = torch.tensor([[True, True, False, False], [True, False, False, False]])
    sp = measure_speedup(model, keep, lengths=(8, 16), repeats=3)
    assert sp.params_pruned < sp.params_full and (sp.heads_kept, sp.heads_total) == (3, 8)
    t = sp.table
    assert t["tokens"].tolist() == [8, 16] and t["runs"].tolist() == [3, 3]
    k = 3 / 8
    assert t["bound"].tolist() == pytest.approx((1 / (1 - t["attention_share"] * (1 - k))).tolist())
    for col in ("full_ms", "pruned_ms", "speedup"):     # medians with their interquartile range
        assert (t[f"{col}_q1"] <= t[col]).all() and (t[col] <= t[f"{col}_q3"]).all()
    with pytest.raises(ValueError, match="every head"):
        measure_speedup(model, torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least 3"):
        measure_speedup(model, keep, repeats=1)
    f_full, f_small = forward_flops(model.cfg, 16), forward_flops(model.prune(keep).cfg, 16)
    assert f_small["other"] == f_full["other"] and f_small["attention"] < f_full["attention"]


def test_speedup_warms_up_and_alternates_the_models(monkeypatch):
    """Untimed warm-up runs of each model first, then rounds that take the models in turn; the
    speed-up is the median of the per-round ratios."""
    from attnviz.latency import speedup
    cfg = lm_config()
    model = random_model(cfg)
    keep = torch.tensor([[True, True, False, False], [True, False, False, False]])
    calls = []

    def timed(m, ids):
        calls.append(m)
        kept = sum(m.cfg.heads_in(i) for i in range(m.cfg.n_layers))
        return {8: 0.010, 3: 0.005, 0: 0.004}[kept]   # full, pruned, no-attention twin

    monkeypatch.setattr(speedup, "time_forward", timed)
    real_prune = type(model).prune
    built = []
    monkeypatch.setattr(type(model), "prune", lambda self, k: built.append(real_prune(self, k)) or built[-1])
    sp = measure_speedup(model, keep, lengths=(8,), repeats=4, warmup=2)
    small, none = built
    assert len(calls) == 3 * 2 + 3 * 4
    warm, timed_runs = calls[:6], calls[6:]
    assert warm == [model, small, none] * 2
    assert timed_runs == [model, small, none, none, small, model] * 2   # alternating order
    row = sp.table.loc[0]
    assert (row["speedup_q1"], row["speedup"], row["speedup_q3"]) == pytest.approx((2.0, 2.0, 2.0))
    assert row["full_ms"] == pytest.approx(10.0) and row["attention_share"] == pytest.approx(0.6)
    from attnviz.latency.speedup import noisy_lengths
    import pandas as pd
    table = pd.DataFrame(dict(tokens=[8, 16, 32], speedup=[1.1, 1.2, 3.0], speedup_q1=[1.05, 0.8, 2.9],
                              speedup_q3=[1.15, 1.6, 3.1], bound=[1.5, 1.5, 1.5]))
    assert noisy_lengths(table) == [16, 32]          # a wide spread, and a speed-up above its bound


def test_latency_figure_shows_the_spread():
    import pandas as pd
    from attnviz.figures.head_figures import latency_figure
    table = pd.DataFrame(dict(tokens=[8, 16], full_ms=[2.0, 4.0], full_ms_q1=[1.5, 3.0], full_ms_q3=[3.0, 4.5],
                              pruned_ms=[1.0, 2.0], pruned_ms_q1=[0.9, 1.9], pruned_ms_q3=[1.2, 2.5]))
    fig = latency_figure(table)
    assert list(fig.data[0].error_y.array) == [1.0, 0.5] and list(fig.data[0].error_y.arrayminus) == [0.5, 1.0]
    assert fig.data[1].error_y.symmetric is False


@pytest.fixture(scope="module")
def minilm():
    import attnviz
    return attnviz.load_model("minilm")


def test_live_outputs_match_single_runs(minilm):
    """The page's one padded batch (text + ranking sentences) equals separate unpadded runs."""
    from attnviz.analysis import effects
    sentences = ["A kitten is resting on a rug.", "Stock markets fell sharply today, and the rest of this is long."]
    mask = torch.ones(6, 12)
    mask[1, 4] = mask[3, 0] = 0
    out = effects.outputs(minilm, "The cat sits on the mat.", mask, 4, sentences)
    tr = minilm.trace("The cat sits on the mat.", head_mask=mask, layers=[4])
    assert torch.allclose(out.attention, tr.attentions[0], atol=1e-5)
    assert torch.allclose(out.embedding, torch.nn.functional.normalize(tr.hidden.mean(0), dim=0), atol=1e-5)
    for s, e in zip(sentences, out.sentence_embeddings):
        alone = torch.nn.functional.normalize(minilm.trace(s, head_mask=mask).hidden.mean(0), dim=0)
        assert torch.allclose(e, alone, atol=1e-5)
    full = effects.outputs(minilm, "The cat sits on the mat.", None, 4, sentences)
    cmp = effects.output_change(full, out, sentences)
    assert cmp["cosine"] < 1 and list(cmp["ranking"]["rank_full"]) == [1, 2]
    assert effects.output_change(full, full, sentences)["cosine"] == pytest.approx(1.0)


def test_live_outputs_language_model():
    from attnviz.analysis import effects
    cfg = lm_config()
    model = one_head_model(cfg)
    ids = list(range(10))
    full = effects.outputs(model, ids)
    same = effects.output_change(full, effects.outputs(model, ids, torch.ones(2, 4)))
    assert same["kl"] == pytest.approx(0.0, abs=1e-6) and same["top1"] == 1.0
    off = torch.ones(2, 4)
    off[SIGNAL] = 0
    changed = effects.output_change(full, effects.outputs(model, ids, off))
    assert changed["kl"] > 0 and full.token_loss.shape == (9,)
    assert changed["perplexity_full"] == pytest.approx(math.exp(float(full.token_loss.mean())), rel=1e-5)


def test_mask_link_encoding_round_trip():
    from attnviz.analysis.pruning import decode_mask, encode_mask
    for seed in range(5):
        keep = torch.rand(30, 9, generator=torch.Generator().manual_seed(seed)) > 0.5
        code = encode_mask(keep)
        assert code.startswith("30x9-") and len(code) <= 5 + 68
        assert torch.equal(decode_mask(code, 30, 9), keep)
    assert decode_mask(encode_mask(torch.zeros(6, 12, dtype=torch.bool)), 6, 12).sum() == 0
    for bad in ("", "6x12", "6x12-xyz", "6x12--1", "6x12-1" + "0" * 30):
        with pytest.raises(ValueError, match="link"):
            decode_mask(bad, 6, 12)


def test_heads_figures():
    import numpy as np
    from attnviz.figures import head_figures
    before, after = torch.rand(4, 4), torch.rand(4, 4)
    fig = head_figures.difference_heatmap(before, after, list("abcd"))
    z = np.asarray(fig.data[0].z, dtype=np.float32)
    assert np.allclose(z, (after - before).numpy()) and fig.data[0].zmid == 0
    assert fig.data[0].zmin == -fig.data[0].zmax
    cfg = lm_config()
    curve = pruning_curve(random_model(cfg), data(cfg, windows=1), step=0.5, max_fraction=0.5, seeds=(0, 1))
    fig = head_figures.curve_figure(curve.summary(), "perplexity")
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert len(lines) == 2 and list(lines[0].x) == [0.0, 50.0]
    with pytest.raises(ValueError, match="one loss per predicted token"):
        head_figures.token_loss_figure(["a", "b", "c"], [1.0], [1.0, 2.0])


# ---------------------------------------------------------------- the live view
def gpt2_config():
    return Config(family="gpt2", task="lm", n_layers=3, n_heads=4, n_kv_heads=4, d_model=32, d_head=8, d_ff=64,
                  vocab_size=40, max_positions=64, norm="layernorm", positional="learned", causal=True,
                  pre_norm=True, activation="gelu", gated_mlp=False, qkv_bias=True, out_bias=True,
                  mlp_bias=True)


@pytest.mark.parametrize("cfg", [lm_config(n_kv=2), gpt2_config(), bert_config()], ids=["gqa-lm", "gpt2", "encoder"])
def test_live_run_starts_at_the_first_changed_layer_and_equals_a_full_run(cfg):
    from attnviz.analysis import effects
    model = random_model(cfg, seed=4)
    ids = list(range(3, 15))
    L, H = cfg.n_layers, cfg.n_heads
    last = L - 1
    full = effects.outputs(model, ids, None, last)
    assert full.start == 0 and len(full.states) == L + 1
    mask = torch.ones(L, H)
    mask[1, 2] = 0
    masked = effects.outputs(model, ids, mask, last, base=full)
    assert masked.start == 1                          # block 0 is the full run's, reused
    again = effects.outputs(model, ids, mask.clone(), last, base=[full, masked])
    assert again is masked                            # the same mask again: nothing computed
    more = mask.clone()
    more[L - 1, 0] = 0
    later = effects.outputs(model, ids, more, last, base=[full, masked])
    assert later.start == L - 1                       # from the previous masked run, not the full one
    early = effects.outputs(model, ids, more, 0, base=[full, masked])
    assert early.start == 0                           # layer 0's attention is captured anew
    for out, m, layer in ((full, None, last), (masked, mask, last), (later, more, last), (early, more, 0)):
        tr = model.trace(ids, head_mask=m, layers=[layer])
        assert torch.allclose(out.attention, tr.attentions[0], atol=1e-6)
        if cfg.task == "lm":
            assert torch.allclose(out.logprobs, tr.logits.log_softmax(-1), atol=1e-5)
        else:
            assert torch.allclose(out.embedding, torch.nn.functional.normalize(tr.hidden.mean(0), dim=0),
                                  atol=1e-6)
    with pytest.raises(ValueError, match="layer must lie"):
        effects.outputs(model, ids, None, L)


class WordTokenizer:
    """A tiny SentencePiece-like tokenizer: longest match over a fixed vocabulary, ▁ = space."""
    vocab = {"▁Mary": 1, "Mary": 2, "▁John": 3, "▁un": 4, "believ": 5, "ably": 6, "▁": 7}

    def __call__(self, text, add_special_tokens=True):
        s, out = text.replace(" ", "▁"), []
        while s:
            piece = max((p for p in self.vocab if s.startswith(p)), key=len, default=None)
            if piece is None:
                raise ValueError(s)
            out.append(self.vocab[piece])
            s = s[len(piece):]
        return {"input_ids": out}

    def convert_ids_to_tokens(self, ids):
        names = {v: k for k, v in self.vocab.items()}
        return [names[i] for i in ids]


def test_one_token_as_typed_or_a_message_saying_how_it_splits():
    from attnviz.analysis.effects import single_token
    tok = WordTokenizer()
    assert single_token(tok, " Mary") == (1, None)
    assert single_token(tok, "▁Mary") == (1, None)              # as SentencePiece writes the piece
    token, note = single_token(tok, "Mary")
    assert token == 2 and "leading space" in note and "' Mary'" in note
    with pytest.raises(ValueError, match=r"' unbelievably' is 3 tokens for this model \(' un' \+ 'believ' \+ 'ably'\)"):
        single_token(tok, " unbelievably")
    with pytest.raises(ValueError, match="type a token"):
        single_token(tok, "   ")


def test_last_position_probability_logit_difference_and_flip():
    from attnviz.analysis.effects import Outputs, last_position, output_change
    def run(last_logits):
        logits = torch.zeros(3, 5)
        logits[-1] = torch.tensor(last_logits)
        lp = logits.log_softmax(-1)
        return Outputs(tokens=list("abc"), attention=None, layer=0, logprobs=lp,
                       token_loss=-lp[:-1, 0])
    full, masked = run([3.0, 1.0, 0.0, 0.0, 0.0]), run([1.0, 2.5, 0.0, 0.0, 0.0])
    n = last_position(full, masked, target=0, other=1)
    assert n["prob_full"] == pytest.approx(float(torch.tensor([3.0, 1, 0, 0, 0]).softmax(0)[0]))
    assert n["logit_diff_full"] == pytest.approx(2.0) and n["logit_diff_masked"] == pytest.approx(-1.5)
    assert n["flipped"] and (n["top1_full"], n["top1_masked"]) == (0, 1)
    assert not last_position(full, full, 0, 1)["flipped"]
    assert output_change(full, masked)["flipped_positions"] == 1        # only the last position differs
    with pytest.raises(ValueError, match="outside the vocabulary"):
        last_position(full, masked, target=5)


def test_attention_note_says_why_a_map_is_empty():
    from attnviz.analysis.effects import attention_note
    keep = torch.ones(6, 12, dtype=torch.bool)
    assert "Every head is on" in attention_note(keep, 5)
    keep[3, 1] = False
    assert "layer 3, so layer 2's map is all zero: pick layer 4 or later" in attention_note(keep, 2)
    assert attention_note(keep, 5).startswith("A mask scales a head's output")
    last = torch.ones(6, 12, dtype=torch.bool)
    last[5, 0] = False
    assert "last layer, so no attention map can change" in attention_note(last, 5)


def test_topk_pair_draws_both_panels_on_one_scale():
    from attnviz.figures.head_figures import topk_pair
    fig = topk_pair((["a", "b"], torch.tensor([0.92, 0.05])), (["c", "d"], [0.11, 0.02]))
    assert fig.layout.xaxis.range == fig.layout.xaxis2.range == (0, 1.0)
    fig = topk_pair((["a", "b"], [0.4, 0.05]), (["c", "d"], [0.11, 0.02]))
    assert fig.layout.xaxis.range == fig.layout.xaxis2.range == (0, pytest.approx(0.44))
    assert list(fig.data[1].x) == [0.11, 0.02] and fig.data[1].xaxis == "x2"
    with pytest.raises(ValueError, match="2 tokens"):
        topk_pair((["a", "b"], [0.4]), (["c"], [0.1]))


# ---------------------------------------------------------------- bounds on long runs
def test_time_budget_is_capped_in_the_library(monkeypatch, set_limits):
    import dataclasses

    from attnviz.analysis import importance
    from attnviz.base import limits
    set_limits(max_importance_seconds=5.0)
    assert importance.time_budget() == 5.0 and importance.time_budget(2) == 2.0
    for bad, why in ((6, "more than this server allows"), (0, "positive"), ("x", "number of seconds")):
        with pytest.raises(ValueError, match=why):
            importance.time_budget(bad)
    cfg = lm_config()
    model, d = random_model(cfg), data(cfg, windows=3)
    with pytest.raises(ValueError, match="more than this server allows"):
        gradient_importance(model, d, max_seconds=60)
    with pytest.raises(ValueError, match="more than this server allows"):
        pruning_curve(model, d, max_seconds=60)
    full = gradient_importance(model, d)
    assert full.complete and full.stopped is None and full.max_seconds == 5.0
    for run in (gradient_importance(model, d, max_seconds=1e-9), ablation_importance(model, d, max_seconds=1e-9),
                pruning_curve(model, d, step=0.5, max_fraction=0.5, seeds=(0,), max_seconds=1e-9)):
        assert not run.complete and run.stopped == "time limit"
    stopped = gradient_importance(model, d, should_stop=lambda: True)
    assert stopped.stopped == "stopped"


def test_live_figures_skip_plotly_overflow_pass_on_every_axis():
    """plotly.js measures every tick label once more to hide overflowing ones unless told to allow
    them; in the Heads page that was about a third of a live redraw (bench/toggle_latency.py)."""
    import numpy as np
    from attnviz.figures import head_figures
    figures = [head_figures.topk_pair((["a", "b"], [0.4, 0.05]), (["c", "d"], [0.11, 0.02])),
               head_figures.token_loss_figure(["a", "b", "c"], [1.0, 2.0], [1.5, 2.5]),
               head_figures.difference_heatmap(np.eye(3), np.eye(3) * 0.5, list("abc"), causal=True)]
    for figure in figures:
        axes = [k for k in figure.layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]
        assert axes and all(figure.layout[k].ticklabeloverflow == "allow" for k in axes)
        assert all(figure.layout[k].automargin for k in axes)   # labels fit without Streamlit's theme
