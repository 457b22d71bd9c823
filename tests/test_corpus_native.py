"""A translator scored against the package's own native engine as well as against its full self:
the metrics on hand-made outputs, then a real en-pt run (library and CLI), where the full model's
greedy output is the native engine's (tests/test_translate.py) so both columns agree exactly."""
import dataclasses

import pandas as pd
import pytest
import torch

from attnviz import evaluate
from attnviz.analysis import corpus, corpus_metrics, corpus_runs
from attnviz.analysis.corpus_engine import has_native, worker_native


def _outputs(rows):
    fulls = [dict(kind="translator", text=f, native=n, score=-1.0) for f, n, _ in rows]
    pruneds = [dict(kind="translator", text=p, score=-2.0) for *_, p in rows]
    return fulls, pruneds


def test_native_metrics_score_the_pruned_text_against_the_native_text():
    fulls, pruneds = _outputs([("o gato", "o gato preto", "o gato"), ("bom dia", "bom dia", "bom dia"),
                               ("a casa", "uma casa", "uma casa")])
    got = [corpus_metrics.compare("translator", f, p) for f, p in zip(fulls, pruneds)]
    assert [g["exact_match"] for g in got] == [1.0, 1.0, 0.0]
    assert [g["exact_match_native"] for g in got] == [0.0, 1.0, 1.0]
    assert [g["full_matches_native"] for g in got] == [0.0, 1.0, 0.0]
    assert got[0]["chrf_native"] == pytest.approx(corpus_metrics.chrf("o gato preto", "o gato"))
    rows = pd.DataFrame(got)
    both = corpus_metrics.summarise("translator", rows, fulls, pruneds, reference="both").set_index("metric")
    assert list(both.index) == corpus_metrics.metric_names("translator", "both")
    assert both.loc["exact_match_native", "value"] == pytest.approx(2 / 3)
    assert both.loc["full_matches_native", "value"] == pytest.approx(1 / 3)
    import sacrebleu
    direct = sacrebleu.corpus_chrf([p["text"] for p in pruneds], [[f["native"] for f in fulls]]).score / 100
    assert both.loc["corpus_chrf_native", "value"] == pytest.approx(direct)
    native = corpus_metrics.summarise("translator", rows, fulls, pruneds, reference="native")
    assert set(native["metric"]) == {"chrf_native", "exact_match_native", "corpus_chrf_native", "full_matches_native"}
    full = corpus_metrics.summarise("translator", rows, fulls, pruneds)
    assert set(full["metric"]) == {"chrf", "exact_match", "corpus_chrf"}
    pd.testing.assert_frame_equal(full.reset_index(drop=True), both.reset_index().iloc[:3].reset_index(drop=True))


def test_native_reference_is_refused_where_it_cannot_be():
    fulls, pruneds = _outputs([("a", "a", "a")])
    rows = pd.DataFrame([corpus_metrics.compare("translator", fulls[0], pruneds[0])])
    with pytest.raises(ValueError, match="needs its translation of every item"):
        corpus_metrics.summarise("translator", rows, [{k: v for k, v in fulls[0].items() if k != "native"}],
                                 pruneds, reference="native")
    with pytest.raises(ValueError, match="only translators"):
        corpus_metrics.metric_names("lm", "native")
    with pytest.raises(ValueError, match="unknown reference"):
        corpus_metrics.metric_names("translator", "google")
    assert has_native("en-pt") and has_native("pt-en") and not has_native("minilm")
    with pytest.raises(ValueError, match="no native engine"):
        worker_native("minilm")


@pytest.fixture(scope="module")
def three_messages():
    gtk = corpus.open_corpus("gtk-en")
    return dataclasses.replace(gtk, items=gtk.items[:3])


MASK = torch.ones(2, 8)
MASK[1, :4] = 0          # half the cross-attention heads of the last decoder layer: translations change


def test_en_pt_run_against_full_and_native(three_messages):
    result = corpus_runs.run("en-pt", three_messages, "mask", mask=MASK, reference="both")
    t = result.summary.set_index("metric")
    assert list(t.index) == corpus_metrics.metric_names("translator", "both")
    # the full model's greedy output is the native engine's on these messages
    assert (result.table["full_matches_native"] == 1.0).all()
    for m in ("chrf", "exact_match", "corpus_chrf"):
        assert t.loc[m, "value"] == t.loc[m + "_native", "value"]
        assert (t.loc[m, "ci_low"], t.loc[m, "ci_high"]) == (t.loc[m + "_native", "ci_low"],
                                                              t.loc[m + "_native", "ci_high"])
    assert t.loc["chrf", "value"] < 1.0     # the mask did change something
    native = worker_native("en-pt")
    assert [native.translate(s) for s in three_messages.items] == [
        corpus_metrics.output(corpus_runs.worker_model("en-pt"), s)["text"] for s in three_messages.items]
    only = corpus_runs.run("en-pt", three_messages, "mask", mask=MASK, reference="native")
    assert only.extra["metric"] == "chrf_native"
    assert set(only.summary["metric"]) == set(corpus_metrics.metric_names("translator", "native"))
    with pytest.raises(ValueError, match="only translators"):
        corpus_runs.run("minilm", corpus.open_corpus("alice-sentences"), "mask", mask=torch.ones(6, 12),
                        reference="native")


def test_cli_reference_both(capsys):
    code = evaluate.main(["gtk-en", "--model", "en-pt", "--kind", "mask", "--mask", "2x8-f0ff",
                          "--reference", "both", "--max-rows", "2"])
    got = capsys.readouterr()
    assert code == 0, got.err
    for m in ("chrf ", "chrf_native", "exact_match_native", "corpus_chrf_native"):
        assert m in got.out, m
    assert evaluate.main(["alice-sentences", "--model", "minilm", "--kind", "mask", "--mask", "6x12-" + "f" * 18,
                          "--reference", "native", "--max-rows", "2"]) == 2
    assert "only translators" in capsys.readouterr().err
