"""Corpus runs on every decoder family: a head mask scored over a corpus, and head importance
accumulated over it, give per text what the model's own trace gives for that text alone. Texts of
different lengths, so a run that batches them pads some (and must not let padding change a figure)."""
import numpy as np
import pytest
import torch

from attnviz.analysis import corpus_engine, corpus_metrics, corpus_runs, importance
from attnviz.analysis.corpus import Corpus
from attnviz.analysis.pruning import encode_mask
from tests.hub_cache import model_folder
from tests.test_family_files import ROWS

# every text at least two tokens under each family's own tokenizer class too (transformers builds
# Qwen2's from the folder's vocabulary with its own pre-tokenizer, which keeps only "a" and ".")
TEXTS = ["the cat sat on the mat .", "a cat . hello world", "a dog ran on the mat and the cat sat .",
         "the dog sat . hello cat"]


@pytest.fixture
def family_model(request, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "converted"))
    folder = tmp_path / request.param
    model_folder(folder, request.param)
    key = str(folder)
    yield key, corpus_engine.worker_model(key)
    corpus_engine._models.clear()   # the next row's folder is another model under another key


def direct(model, text, head_mask):
    """The text's log-probabilities under `head_mask`, from one trace of it alone."""
    ids, _ = model.encode_text(text)
    with torch.inference_mode():
        logits = model.trace(ids, head_mask=head_mask, attentions=False).logits.double()
    return ids, logits.log_softmax(-1)


def top(logprobs):
    values, ids = logprobs.topk(min(corpus_metrics.TOP_K, logprobs.shape[-1]), dim=-1)
    return dict(top_ids=ids.numpy(), top_logprobs=values.numpy())


@pytest.mark.parametrize("family_model", ROWS, indirect=True)
def test_a_mask_over_a_corpus_equals_each_texts_own_trace(family_model):
    key, model = family_model
    L, H = int(model.mask_layers), int(model.cfg.n_heads)
    keep = torch.ones(L, H, dtype=torch.bool)
    keep[0, 0] = keep[L - 1, H - 1] = False
    run = corpus_runs.run(key, Corpus("four", "text", list(TEXTS)), "mask", mask=encode_mask(keep))
    assert run.complete and list(run.table["item"]) == [0, 1, 2, 3]
    for _, row in run.table.iterrows():
        ids, full = direct(model, TEXTS[row["item"]], None)
        _, pruned = direct(model, TEXTS[row["item"]], keep.float())
        nll = lambda lp: float(-lp[:-1].gather(-1, ids[1:, None]).sum())  # noqa: E731
        assert row["nll_full"] == pytest.approx(nll(full), rel=1e-4, abs=1e-4)
        assert row["nll_pruned"] == pytest.approx(nll(pruned), rel=1e-4, abs=1e-4)
        kl = corpus_metrics.lm_kl(top(full), top(pruned)).mean()   # the run's KL over its top tokens
        assert row["kl"] == pytest.approx(float(kl), rel=1e-3, abs=1e-6)
        assert row["top1"] == pytest.approx(float((full.argmax(-1) == pruned.argmax(-1)).double().mean()))
    assert (run.table["nll_full"] != run.table["nll_pruned"]).any()   # the mask did change the model


@pytest.mark.parametrize("family_model", ["llama", "gemma3_text", "bloom", "mixtral", "opt_post_ln"], indirect=True)
def test_importance_over_a_corpus_is_the_mean_of_each_texts_own(family_model):
    key, model = family_model
    run = corpus_runs.run(key, Corpus("four", "text", list(TEXTS)), "importance", seed=3)
    assert run.complete
    raws = []
    for i, text in enumerate(TEXTS):
        data = importance.eval_windows(model, text, max_tokens=corpus_runs.ITEM_TOKENS, window=corpus_runs.ITEM_TOKENS)
        raws.append(importance.gradient_importance(model, data, seed=corpus_runs.item_seed(3, i)).raw.double().numpy())
    want = np.mean(raws, axis=0)
    got = np.array(run.extra["importance_raw"]) if "importance_raw" in run.extra else None
    raw = run.summary.set_index("metric")["raw"]
    got = np.array([[raw[f"L{i}H{h}"] for h in range(want.shape[1])] for i in range(want.shape[0])]) \
        if got is None else got
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
