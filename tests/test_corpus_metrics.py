"""Corpus metrics: 1 / 0 on identical outputs, hand-checked values, exact KL on a small vocabulary,
Spearman with labels, confidence intervals that hold the value, and determinism."""
import numpy as np
import pandas as pd
import pytest
import torch

from attnviz.analysis import corpus, corpus_metrics
from attnviz.weights.catalogue import load_model, random_model
from tests.tiny import BERT, LLAMA


class WordTokenizer:
    """'t3 t7 t1' -> [0, 3, 7, 1]: id 0 is a start token (special)."""
    all_special_ids = [0]
    bos_token_id = 0

    def __call__(self, text, **kw):
        return {"input_ids": [0] + [int(t[1:]) for t in text.split()]}

    def convert_ids_to_tokens(self, ids):
        return [f"t{i}" for i in ids]


@pytest.fixture(scope="module")
def lm():
    return random_model(LLAMA, seed=3, tokenizer=WordTokenizer())


@pytest.fixture(scope="module")
def encoder():
    return random_model(BERT, seed=4, tokenizer=WordTokenizer())


TEXTS = ["t5 t9 t2 t7 t3", "t1 t1 t4 t8", "t6 t2 t2 t2 t9 t11", "t30 t31 t32"]


def test_model_kind(lm, encoder):
    assert corpus_metrics.model_kind(lm) == "lm" and corpus_metrics.model_kind(encoder) == "encoder"
    assert set(corpus_metrics.PRIMARY) == {"lm", "encoder", "translator", "speech", "vision"}


def test_lm_identical_outputs_agree_fully_and_kl_is_zero(lm):
    full = corpus_metrics.output(lm, TEXTS[0])
    again = corpus_metrics.output(lm, TEXTS[0])
    for k in ("top_ids", "top_logprobs", "nll"):
        assert np.array_equal(full[k], again[k])          # deterministic
    got = corpus_metrics.compare("lm", full, again)
    assert got["top1"] == 1.0 and got["kl"] == 0.0 and got["perplexity_full"] == got["perplexity_pruned"]


def test_lm_kl_is_exact_when_the_vocabulary_fits_in_top_k(lm):
    assert LLAMA.vocab_size <= corpus_metrics.TOP_K
    mask = torch.ones(3, 4)
    mask[0, :3] = 0
    full, pruned = corpus_metrics.output(lm, TEXTS[2]), corpus_metrics.output(lm, TEXTS[2], mask)
    ids = torch.tensor([0, 6, 2, 2, 2, 9, 11])
    p = lm.trace(ids, attentions=False).logits.double().log_softmax(-1)
    q = lm.trace(ids, head_mask=mask, attentions=False).logits.double().log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1)
    assert corpus_metrics.lm_kl(full, pruned) == pytest.approx(kl.numpy(), abs=1e-5)
    got = corpus_metrics.compare("lm", full, pruned)
    assert got["kl"] == pytest.approx(float(kl.mean()), abs=1e-5)
    assert got["top1"] == pytest.approx(float((p.argmax(-1) == q.argmax(-1)).double().mean()))
    nll = -p[:-1].gather(-1, ids[1:, None]).sum()
    assert got["nll_full"] == pytest.approx(float(nll), rel=1e-5) and got["tokens"] == 6


def test_lm_kl_bucket_with_a_small_top_k_is_a_lower_bound(lm, monkeypatch):
    mask = torch.ones(3, 4)
    mask[1] = 0
    exact = corpus_metrics.lm_kl(corpus_metrics.output(lm, TEXTS[0]), corpus_metrics.output(lm, TEXTS[0], mask))
    monkeypatch.setattr(corpus_metrics, "TOP_K", 5)
    bound = corpus_metrics.lm_kl(corpus_metrics.output(lm, TEXTS[0]), corpus_metrics.output(lm, TEXTS[0], mask))
    assert (bound <= exact + 1e-6).all() and (bound >= 0).all()


def test_tokens_per_item_are_bounded(lm, encoder):
    long = " ".join(f"t{i % 40 + 1}" for i in range(100))
    out = corpus_metrics.output(lm, long, max_tokens=16)
    assert len(out["nll"]) == 15 and out["cut"] == 101 - 16
    assert corpus_metrics.output(encoder, long, max_tokens=16)["cut"] == 101 - 16


def test_encoder_cosine_nn_agreement_and_pair_scores(encoder):
    fulls = [corpus_metrics.output(encoder, t) for t in TEXTS]
    rows = pd.DataFrame([corpus_metrics.compare("encoder", f, f) for f in fulls])
    assert (rows["cosine"] - 1).abs().max() < 1e-6
    table = corpus_metrics.summarise("encoder", rows, fulls, fulls).set_index("metric")
    assert table.loc["nn_agreement", "value"] == 1.0 and table.loc["cosine", "value"] == pytest.approx(1.0)
    pair = corpus_metrics.output(encoder, "t1 t2\tt1 t2")
    assert pair["score"] == pytest.approx(1.0)


def test_nearest_neighbour_agreement_by_hand():
    full = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], float)
    # pruned: item 0's nearest becomes item 3 instead of 1; the others keep theirs
    pruned = np.array([[0.2, 0.8], [0.9, 0.1], [0, 1], [0.1, 0.9]], float)
    assert corpus_metrics.nn_agreement(full, pruned).tolist() == [0.0, 1.0, 1.0, 1.0]


def test_text_metrics_by_hand():
    assert corpus_metrics.word_error_rate("Hello, World!", "hello world") == 0.0
    assert corpus_metrics.word_error_rate("one two three four", "one too three") == pytest.approx(0.5)
    assert corpus_metrics.word_error_rate("", "") == 0.0 and corpus_metrics.word_error_rate("", "noise") == 1.0
    assert corpus_metrics.chrf("Eu te amo.", "Eu te amo.") == 1.0
    assert 0 < corpus_metrics.chrf("Eu te amo muito.", "Eu te amo.") < 1
    assert corpus_metrics.chrf("abc", "xyz") == 0.0
    s = corpus_metrics.compare("speech", dict(kind="speech", text="a b c d", score=-1.0),
                   dict(kind="speech", text="a b x d", score=-2.0))
    assert s["wer"] == 0.25 and s["word_accuracy"] == 0.75
    t = corpus_metrics.compare("translator", dict(kind="translator", text="x", score=0.0), dict(kind="translator", text="x", score=0.0))
    assert t["chrf"] == 1.0 and t["exact_match"] == 1.0


def test_vision_compare_by_hand():
    full = dict(kind="vision", cls=np.array([1.0, 0.0]), salient=np.array([[1, 1], [0, 0]], bool), score=np.nan)
    pruned = dict(kind="vision", cls=np.array([1.0, 1.0]), salient=np.array([[1, 0], [0, 0]], bool), score=np.nan)
    got = corpus_metrics.compare("vision", full, pruned)
    assert got["cls_cosine"] == pytest.approx(2 ** -0.5) and got["saliency_iou"] == 0.5


def _translations(pairs):
    fulls = [dict(kind="translator", text=a, score=s) for a, _, s in pairs]
    pruneds = [dict(kind="translator", text=b, score=s - 0.1) for _, b, s in pairs]
    return fulls, pruneds


def test_summary_ci_holds_the_value_and_is_deterministic():
    pairs = [("o gato", "o gato"), ("um cão grande", "um cão"), ("a casa azul", "a casa verde"),
             ("bom dia", "bom dia"), ("obrigado pela ajuda", "obrigada pela ajuda")]
    fulls, pruneds = _translations([(a, b, -i) for i, (a, b) in enumerate(pairs)])
    rows = pd.DataFrame([corpus_metrics.compare("translator", f, p) for f, p in zip(fulls, pruneds)])
    table = corpus_metrics.summarise("translator", rows, fulls, pruneds, seed=7)
    assert list(table.columns) == ["metric", "value", "ci_low", "ci_high", "n"]
    assert ((table.ci_low <= table.value) & (table.value <= table.ci_high)).all() and (table.n == 5).all()
    t = table.set_index("metric")
    assert t.loc["exact_match", "value"] == pytest.approx(0.4)
    assert t.loc["chrf", "value"] == pytest.approx(rows["chrf"].mean())
    assert t.loc["corpus_chrf", "ci_low"] < t.loc["corpus_chrf", "ci_high"]
    pd.testing.assert_frame_equal(table, corpus_metrics.summarise("translator", rows, fulls, pruneds, seed=7))
    assert not table.equals(corpus_metrics.summarise("translator", rows, fulls, pruneds, seed=8))


def test_corpus_chrf_matches_sacrebleu_directly():
    import sacrebleu
    fulls, pruneds = _translations([("o gato preto", "o gato", 0), ("bom dia", "boa tarde", 0)])
    rows = pd.DataFrame([corpus_metrics.compare("translator", f, p) for f, p in zip(fulls, pruneds)])
    value = corpus_metrics.summarise("translator", rows, fulls, pruneds).set_index("metric").loc["corpus_chrf", "value"]
    direct = sacrebleu.corpus_chrf(["o gato", "boa tarde"], [["o gato preto", "bom dia"]]).score / 100
    assert value == pytest.approx(direct)


def test_labels_give_spearman_of_each_models_score():
    fulls, pruneds = _translations([("a", "a", s) for s in (-3.0, -1.0, -2.0, -0.5)])
    rows = pd.DataFrame([corpus_metrics.compare("translator", f, p) for f, p in zip(fulls, pruneds)])
    t = corpus_metrics.summarise("translator", rows, fulls, pruneds, labels=[1, 3, 2, 4]).set_index("metric")
    assert t.loc["spearman_full", "value"] == pytest.approx(1.0)
    assert t.loc["spearman_pruned", "value"] == pytest.approx(1.0)
    t = corpus_metrics.summarise("translator", rows, fulls, pruneds, labels=[4, 2, 3, 1]).set_index("metric")
    assert t.loc["spearman_full", "value"] == pytest.approx(-1.0)


def test_lm_summary_pools_perplexity_over_tokens(lm):
    fulls = [corpus_metrics.output(lm, t) for t in TEXTS]
    rows = pd.DataFrame([corpus_metrics.compare("lm", f, f) for f in fulls])
    t = corpus_metrics.summarise("lm", rows, fulls, fulls).set_index("metric")
    pooled = np.exp(sum(f["nll"].sum() for f in fulls) / sum(len(f["nll"]) for f in fulls))
    assert t.loc["perplexity_full", "value"] == pytest.approx(pooled, rel=1e-6)
    assert t.loc["top1", "value"] == 1.0 and t.loc["kl", "value"] == 0.0
    assert t.loc["top1", "ci_low"] == t.loc["top1", "ci_high"] == 1.0


def test_bad_calls_are_refused():
    with pytest.raises(ValueError, match="unknown model kind"):
        corpus_metrics.compare("robot", {}, {})
    with pytest.raises(ValueError, match="of a lm model"):
        corpus_metrics.compare("lm", dict(kind="encoder"), dict(kind="lm"))
    with pytest.raises(ValueError, match="one row"):
        corpus_metrics.summarise("lm", pd.DataFrame(), [], [])


def test_translator_on_the_bundled_corpus_is_deterministic_and_masks_change_it():
    model = load_model("en-pt")
    items = corpus.open_corpus("gtk-en").items[:2]
    full = [corpus_metrics.output(model, t) for t in items]
    assert [corpus_metrics.output(model, t)["text"] for t in items] == [f["text"] for f in full]
    assert all(corpus_metrics.compare("translator", f, f)["chrf"] == 1.0 for f in full)
    mask = torch.zeros(model.mask_layers, model.cfg.n_heads)
    pruned = [corpus_metrics.output(model, t, mask) for t in items]
    assert any(corpus_metrics.compare("translator", f, p)["chrf"] < 1.0 for f, p in zip(full, pruned))
    with pytest.raises(ValueError, match="reads images"):
        corpus_metrics.output(load_model("dinov2"), "text")
