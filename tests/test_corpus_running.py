"""While a corpus run goes, each progress report carries a running summary over the items done:
per step, each per-item metric's mean with a normal 95 % interval; the end gives the full summary."""
import numpy as np
import pandas as pd
import pytest
import torch

from attnviz.analysis import corpus_runs
from attnviz.analysis.corpus import Corpus

TEXTS = ["The cat sat on the mat.", "Stock markets fell sharply today.", "A kitten is resting on a rug.",
         "I love you very much."]


def test_progress_carries_a_running_summary_of_the_items_done():
    mask = torch.ones(6, 12)
    mask[:2, :6] = 0
    seen = []
    corpus = Corpus("t", "text", TEXTS, None, [], "tests", "test")
    final = corpus_runs.run("minilm", corpus, "mask", mask=mask, progress=lambda d, t, p: seen.append(p))
    assert [p.extra["running"] for p in seen] == [1, 2, 3, 4]
    for p in seen:
        s = p.summary.set_index("metric")
        assert list(s.index) == ["cosine"]             # nn_agreement is a corpus-level figure: at the end
        cos = p.table["cosine"].to_numpy(float)
        assert s.loc["cosine", "value"] == pytest.approx(cos.mean()) and s.loc["cosine", "n"] == len(cos)
        if len(cos) == 1:
            assert np.isnan(s.loc["cosine", "ci_low"])
        else:
            half = corpus_runs.Z95 * cos.std(ddof=1) / np.sqrt(len(cos))
            assert s.loc["cosine", "ci_high"] - s.loc["cosine", "value"] == pytest.approx(half)
    assert "running" not in final.extra and set(final.summary["metric"]) == {"cosine", "nn_agreement"}
    assert final.summary.set_index("metric").loc["cosine", "value"] == pytest.approx(seen[-1].summary["value"][0])


def test_running_summary_per_step_of_a_curve_table():
    table = pd.DataFrame(dict(item=[0, 0, 1, 1], order=["importance", "random 1"] * 2, fraction=[0.3] * 4,
                              heads_kept=[50] * 4, top1=[1.0, 0.5, 0.0, 0.5], kl=[0.1, 0.2, 0.3, 0.4],
                              perplexity_pruned=[5.0, 6.0, 7.0, 8.0]))
    got = corpus_runs.running_summary(table, ["top1", "kl", "perplexity_pruned", "perplexity_full"])
    assert list(got.columns) == corpus_runs.SUMMARY_COLUMNS
    assert list(zip(got["order"], got["metric"])) == [("importance", "top1"), ("importance", "kl"),
                                                      ("random 1", "top1"), ("random 1", "kl")]
    assert list(got["value"]) == pytest.approx([0.5, 0.2, 0.5, 0.3]) and (got["n"] == 2).all()
    assert corpus_runs.running_summary(table.iloc[:0], ["top1"]).empty
