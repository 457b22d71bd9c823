"""attnviz.head_scores: previous-token / induction / duplicate-token scores per head, checked against
hand-built attention patterns, a written-out formula on real traces, and SmolLM2's real heads."""
import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

import attnviz
from attnviz.analysis import head_scores
from attnviz.core.config import Config
from attnviz.weights.catalogue import random_model

from tests import tiny as configs

LLAMA = dataclasses.replace(configs.LLAMA, max_positions=64)
BERT = dataclasses.replace(configs.BERT, max_positions=64)
VIT = Config(family="vit", task="vision", n_layers=1, n_heads=2, n_kv_heads=2, d_model=8, d_head=4, d_ff=16,
             image_size=28, patch_size=14, pre_norm=True)


@pytest.fixture(scope="module")
def tiny():
    return random_model(LLAMA, seed=3)


# ---------------------------------------------------------------- hand-built attention
def _pattern(n, target):
    """[n, n] attention where row q puts all its weight on key target(q)."""
    a = torch.zeros(n, n)
    for q in range(n):
        a[q, target(q)] = 1.0
    return a


@pytest.mark.parametrize("prefix", [0, 1])
def test_perfect_heads_score_one_on_their_own_score(prefix):
    T = 6
    n = prefix + 2 * T
    copy = range(prefix + T, n)
    prev = _pattern(n, lambda q: max(q - 1, 0))
    induction = _pattern(n, lambda q: q - T + 1 if q in copy else 0)
    duplicate = _pattern(n, lambda q: q - T if q in copy else 0)
    s = head_scores.scores_from_attention(torch.stack([prev, induction, duplicate]), T, prefix)
    assert s["previous_token"][0] == 1 and s["induction"][0] == 0 and s["duplicate_token"][0] == 0
    assert s["induction"][1] == 1 and s["duplicate_token"][1] == 0
    assert s["duplicate_token"][2] == 1 and s["induction"][2] == 0
    # only row 1 -> key 0 lies on the previous-token diagonal for the other two heads
    assert s["previous_token"][1] == pytest.approx(1 / (n - 1))
    assert s["previous_token"][2] == pytest.approx(1 / (n - 1))


@pytest.mark.parametrize("prefix", [0, 1])
def test_uniform_causal_attention_matches_closed_form(prefix):
    T = 7
    n = prefix + 2 * T
    a = torch.tril(torch.ones(n, n))
    a = a / a.sum(-1, keepdim=True)          # row q: 1 / (q + 1) on every visible key
    s = head_scores.scores_from_attention(a[None, None], T, prefix)
    want_prev = np.mean([1 / (q + 1) for q in range(1, n)])
    want_copy = np.mean([1 / (q + 1) for q in range(prefix + T, n)])
    assert s["previous_token"].shape == (1, 1)
    assert float(s["previous_token"]) == pytest.approx(want_prev)
    assert float(s["induction"]) == pytest.approx(want_copy)
    assert float(s["duplicate_token"]) == pytest.approx(want_copy)


def test_scores_from_attention_refuses_a_wrong_size():
    with pytest.raises(ValueError, match="cannot hold"):
        head_scores.scores_from_attention(torch.zeros(2, 11, 11), 5, prefix=0)


# ---------------------------------------------------------------- real traces of a tiny model
def test_table_shape_ranges_and_determinism(tiny):
    df = head_scores.head_scores(tiny, seq_len=10, n_seqs=2, seed=1)
    assert list(df.columns) == ["layer", "head", "previous_token", "induction", "duplicate_token"]
    assert len(df) == LLAMA.n_layers * LLAMA.n_heads
    assert list(zip(df.layer, df["head"])) == [(l, h) for l in range(3) for h in range(4)]
    scores = df[list(head_scores.SCORES)].to_numpy()
    assert np.isfinite(scores).all() and (scores >= 0).all() and (scores <= 1).all()
    pd.testing.assert_frame_equal(df, head_scores.head_scores(tiny, seq_len=10, n_seqs=2, seed=1))
    assert not df.equals(head_scores.head_scores(tiny, seq_len=10, n_seqs=2, seed=2))
    assert df.attrs["prefix"] == 0 and df.attrs["bos_id"] is None  # no tokenizer: no BOS


def test_sequences_are_a_distinct_block_repeated(tiny):
    ids, prefix = head_scores.repeated_tokens(tiny, seq_len=20, n_seqs=3, seed=4)
    assert prefix == 0 and ids.shape == (3, 40)
    for row in ids:
        first, second = row[:20], row[20:]
        assert torch.equal(first, second) and len(set(first.tolist())) == 20
    assert not torch.equal(ids[0], ids[1])
    again, _ = head_scores.repeated_tokens(tiny, seq_len=20, n_seqs=3, seed=4)
    assert torch.equal(ids, again)


def test_table_equals_the_written_out_formula_on_each_trace(tiny):
    T, S = 9, 3
    df = head_scores.head_scores(tiny, seq_len=T, n_seqs=S, seed=5)
    ids, p = head_scores.repeated_tokens(tiny, seq_len=T, n_seqs=S, seed=5)
    n = p + 2 * T
    want = {k: np.zeros((LLAMA.n_layers, LLAMA.n_heads)) for k in head_scores.SCORES}
    for row in ids:
        a = tiny.trace(row).attentions.double().numpy()
        for l in range(LLAMA.n_layers):
            for h in range(LLAMA.n_heads):
                want["previous_token"][l, h] += sum(a[l, h, q, q - 1] for q in range(1, n)) / (n - 1) / S
                want["duplicate_token"][l, h] += sum(a[l, h, q, q - T] for q in range(p + T, n)) / T / S
                want["induction"][l, h] += sum(a[l, h, q, q - T + 1] for q in range(p + T, n)) / T / S
    for k in head_scores.SCORES:
        np.testing.assert_allclose(df[k].to_numpy(), want[k].flatten(), atol=1e-6)


def test_batches_for_bounded_memory_give_the_same_table(tiny, monkeypatch, set_limits):
    whole = head_scores.head_scores(tiny, seq_len=12, n_seqs=3, seed=0)
    batches = []
    layer_weights = head_scores._layer_weights

    def counting(model, ids, *args):
        batches.append(len(ids))
        yield from layer_weights(model, ids, *args)

    monkeypatch.setattr(head_scores, "_layer_weights", counting)
    head_scores.head_scores(tiny, seq_len=12, n_seqs=3, seed=0)
    assert batches == [3]                       # 3 x 4 x 24 x 24 floats: one batch
    batches.clear()
    set_limits(attention_capture_mb=0)
    one_by_one = head_scores.head_scores(tiny, seq_len=12, n_seqs=3, seed=0)
    assert batches == [1, 1, 1]                 # below the budget: one sequence at a time
    pd.testing.assert_frame_equal(whole, one_by_one, check_exact=False, atol=1e-6)


def test_head_mask_changes_later_layers_only(tiny):
    mask = torch.ones(LLAMA.n_layers, LLAMA.n_heads)
    mask[0] = 0
    plain = head_scores.head_scores(tiny, seq_len=8, n_seqs=1)
    masked = head_scores.head_scores(tiny, seq_len=8, n_seqs=1, head_mask=mask)
    first = plain.layer == 0
    pd.testing.assert_frame_equal(plain[first], masked[first])
    assert not np.allclose(plain[~first].induction, masked[~first].induction)


def test_pruned_heads_read_nan_and_the_rest_match_the_mask(tiny):
    keep = torch.ones(LLAMA.n_layers, LLAMA.n_heads, dtype=torch.bool)
    keep[1, 2] = False
    pruned = head_scores.head_scores(tiny.prune(keep), seq_len=8, n_seqs=2)
    masked = head_scores.head_scores(tiny, seq_len=8, n_seqs=2, head_mask=keep.float())
    gone = (pruned.layer == 1) & (pruned["head"] == 2)
    assert pruned[gone][list(head_scores.SCORES)].isna().all(axis=None)
    np.testing.assert_allclose(pruned[~gone][list(head_scores.SCORES)].to_numpy(),
                               masked[~gone][list(head_scores.SCORES)].to_numpy(), atol=1e-5)


def test_top_heads_sorts_by_score(tiny):
    df = head_scores.head_scores(tiny, seq_len=8, n_seqs=1)
    top = head_scores.top_heads(df, "induction", k=3)
    assert len(top) == 3 and list(top.induction) == sorted(df.induction, reverse=True)[:3]
    with pytest.raises(ValueError, match="score must be one of"):
        head_scores.top_heads(df, "layer")


class _BosTokenizer:
    """Prepends special id 0 to every text, like many LM tokenizers; ids 0 and 1 are special."""
    all_special_ids = [0, 1]
    bos_token_id = 0

    def __call__(self, text, **kw):
        return {"input_ids": [0] + [int(t[1:]) for t in text.split()]}

    def convert_ids_to_tokens(self, ids):
        return [f"t{i}" for i in ids]


def test_bos_follows_the_tokenizer_and_special_tokens_are_never_drawn():
    model = random_model(LLAMA, seed=0, tokenizer=_BosTokenizer())
    ids, prefix = head_scores.repeated_tokens(model, seq_len=30, n_seqs=4, seed=0)
    assert prefix == 1 and (ids[:, 0] == 0).all()
    assert not torch.isin(ids[:, 1:], torch.tensor([0, 1])).any()
    ids, prefix = head_scores.repeated_tokens(model, seq_len=30, n_seqs=4, seed=0, prepend_bos=False)
    assert prefix == 0 and ids.shape == (4, 60)
    df = head_scores.head_scores(model, seq_len=30, n_seqs=1)
    assert df.attrs["prefix"] == 1 and df.attrs["bos_id"] == 0
    # max_positions 64: with a BOS, 2T + 1 <= 64 allows T = 31 at most
    assert head_scores.max_seq_len(model, prefix=1) == 31
    with pytest.raises(ValueError, match="seq_len must lie in 4..31"):
        head_scores.repeated_tokens(model, seq_len=32)


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("cfg,what", [(BERT, "bidirectional encoder"), (VIT, "vision model")])
def test_encoders_and_vision_models_are_refused(cfg, what):
    with pytest.raises(ValueError, match=what):
        head_scores.head_scores(random_model(cfg))


@pytest.mark.parametrize("kwargs,match", [
    (dict(seq_len=3), "seq_len must lie in 4..32"),
    (dict(seq_len=33), "seq_len must lie in 4..32"),
    (dict(seq_len=10.5), "seq_len must be a whole number"),
    (dict(seq_len=True), "seq_len must be a whole number"),
    (dict(n_seqs=0), "n_seqs must lie in 1..32"),
    (dict(n_seqs=33), "n_seqs must lie in 1..32"),
    (dict(seed="x"), "seed must be a whole number"),
    (dict(seed=-1), "seed must lie in"),
    (dict(prepend_bos=True), "has no BOS token"),
    (dict(head_mask=torch.ones(2, 2)), "head_mask must have shape"),
])
def test_bad_arguments_are_refused(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        head_scores.head_scores(tiny, **kwargs)


def test_sequence_length_is_capped_at_1024_tokens():
    big = random_model(dataclasses.replace(LLAMA, n_layers=1, vocab_size=2000, max_positions=4096))
    assert head_scores.max_seq_len(big, prefix=0) == 512 and head_scores.max_seq_len(big, prefix=1) == 511
    with pytest.raises(ValueError, match="seq_len must lie in 4..512"):
        head_scores.repeated_tokens(big, seq_len=513)


def test_a_deadline_stops_between_forward_passes(tiny):
    from attnviz.base.jobs import Deadline, JobTimeout
    with pytest.raises(JobTimeout):
        head_scores.head_scores(tiny, seq_len=8, deadline=Deadline(0))


# ---------------------------------------------------------------- the bundled SmolLM2
@pytest.fixture(scope="module")
def smollm2_scores():
    model = attnviz.load_model("smollm2")
    return model, head_scores.head_scores(model)   # T = 50, 4 sequences, seed 0


def test_smollm2_has_real_induction_and_previous_token_heads(smollm2_scores):
    model, df = smollm2_scores
    assert len(df) == 30 * 9
    # measured (seeds 0 and 1, with and without BOS): induction max 0.86-0.89 (L18H6), then L17H3/4/5
    # at 0.62-0.78; mean 0.034-0.037. previous-token max 0.87-0.90 (L16H0). duplicate max 0.67-0.76.
    assert df.induction.max() > 0.6 and df.induction.mean() < 0.1
    assert (df.induction > 0.4).sum() >= 3
    assert df.previous_token.max() > 0.7
    assert df.duplicate_token.max() > 0.5
    # induction composes with an earlier previous-token head
    best = head_scores.top_heads(df, "induction", 1).iloc[0]
    prev_layers = df[df.previous_token > 0.5].layer
    assert prev_layers.min() < best.layer
    # the score picks heads: the best induction head is no previous-token or duplicate head
    row = df[(df.layer == best.layer) & (df["head"] == best["head"])].iloc[0]
    assert row.previous_token < 0.2 and row.duplicate_token < 0.2


def test_smollm2_sequences_use_ordinary_tokens_without_bos(smollm2_scores):
    model, df = smollm2_scores
    assert df.attrs["prefix"] == 0          # SmolLM2's tokenizer adds no BOS to text
    ids, prefix = head_scores.repeated_tokens(model, seq_len=50, n_seqs=4, seed=0)
    assert prefix == 0
    special = torch.tensor(sorted(model.tokenizer.added_tokens_decoder))
    assert not torch.isin(ids, special).any()
    texts = model.tokenizer.batch_decode([[i] for i in ids[0].tolist()])
    assert all(t.strip() and t.isprintable() and "\ufffd" not in t for t in texts)
    forced, prefix = head_scores.repeated_tokens(model, seq_len=50, n_seqs=1, seed=0, prepend_bos=True)
    assert prefix == 1 and int(forced[0, 0]) == model.tokenizer.bos_token_id


def test_smollm2_batched_pass_equals_scores_of_its_traces(smollm2_scores):
    model, _ = smollm2_scores
    df = head_scores.head_scores(model, seq_len=20, n_seqs=2, seed=3)
    ids, prefix = head_scores.repeated_tokens(model, seq_len=20, n_seqs=2, seed=3)
    parts = [head_scores.scores_from_attention(model.trace(row).attentions, 20, prefix) for row in ids]
    for k in head_scores.SCORES:
        want = ((parts[0][k] + parts[1][k]) / 2).flatten().numpy()
        np.testing.assert_allclose(df[k].to_numpy(), want, atol=1e-5)
