"""The Heads page's Corpus tool (AppTest, MiniLM): a run on a tiny bundled corpus gives a table, a chart
and CSVs; a bad upload is explained and the page keeps what it had."""
from pathlib import Path

import pandas as pd

from streamlit.testing.v1 import AppTest

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "2_Heads.py")


def corpus_tool() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=300).run()
    assert not at.exception
    at.button_group(key="heads.tool").set_value("Corpus").run()
    assert not at.exception
    return at


def test_a_mask_run_on_five_bundled_sentences_gives_a_table_chart_and_csv(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTNVIZ_SCHEDULER", raising=False)
    at = corpus_tool()
    assert at.selectbox(key="heads.corpus_pick").value == "alice-sentences"
    at.selectbox(key="heads.corpus_kind").set_value("mask").run()
    at.selectbox(key="heads.corpus_n").set_value(5).run()
    assert not at.exception and "in this process" in " ".join(c.value for c in at.caption)
    at.button(key="heads.corpus_go").click().run()
    assert not at.exception, at.exception
    frames = [d.value for d in at.dataframe if "metric" in d.value.columns and "ci_low" in d.value.columns]
    assert len(frames) == 1, [e.value for e in at.error]
    summary = frames[0]
    by_metric = summary.set_index("metric")
    # every head is on in the default mask: the pruned model is the full one
    assert by_metric.loc["cosine", "value"] == 1.0 and by_metric.loc["nn_agreement", "value"] == 1.0
    assert (summary["n"] == 5).all()
    assert at.get("plotly_chart")
    labels = [b.label for b in at.get("download_button")]
    assert "Summary CSV" in labels and "Per-text CSV" in labels
    result = at.session_state["heads.corpus:minilm"][0]
    assert result.complete and result.done == result.total == 5 and len(result.table) == 5


def test_bad_upload_is_explained_and_the_last_corpus_stays():
    at = corpus_tool()
    at.selectbox(key="heads.corpus_pick").set_value("upload a file (.txt, .csv, .jsonl)").run()
    at.file_uploader(key="heads.corpus_file").set_value(("good.csv", b"text,score\nA cat.,1\nA dog.,2\n", "text/csv"))
    at.text_input(key="heads.corpus_label").input("score").run()
    assert not at.exception
    assert "2 texts" in " ".join(c.value for c in at.caption) and "labelled" in " ".join(c.value for c in at.caption)
    at.file_uploader(key="heads.corpus_file").set_value(("bad.csv", b"text,score\nA cat.,high\n", "text/csv")).run()
    assert not at.exception
    assert any("not a number" in e.value and "unchanged" in e.value for e in at.error)
    assert "2 texts" in " ".join(c.value for c in at.caption)   # still the good corpus
    assert at.session_state["heads.corpus_upload"][1].key == "good.csv"


def test_a_stopped_run_keeps_its_partial_result_and_resumes_from_its_file(monkeypatch, tmp_path, deadline_after_checks):
    from attnviz.analysis import corpus_runs
    from attnviz.ui import heads_corpus
    monkeypatch.delenv("ATTNVIZ_SCHEDULER", raising=False)
    monkeypatch.setenv("ATTNVIZ_PRIVATE_DIR", str(tmp_path / "private"))
    deadline_after_checks(1)      # the first of two batches (3 and 2 texts) runs, then the budget is spent
    at = corpus_tool()
    at.selectbox(key="heads.corpus_n").set_value(5).run()
    at.button(key="heads.corpus_go").click().run()
    assert not at.exception, at.exception
    first = at.session_state["heads.corpus:minilm"][0]
    assert not first.complete and first.done == 3 and first.total == 5 and len(first.table) == 3
    assert any("after 3 of 5 steps" in w.value for w in at.warning)
    folder = tmp_path / "private" / "corpus-runs"
    (results,) = list(folder.iterdir())               # the finished texts were written as they came
    assert len(results.read_text().splitlines()) == 1 + 3
    monkeypatch.undo()
    monkeypatch.setenv("ATTNVIZ_PRIVATE_DIR", str(tmp_path / "private"))
    ran, task = [], corpus_runs.batch_task

    def counted(model_key, params, index, chunk):
        ran.extend(i for i, _ in chunk)
        return task(model_key, params, index, chunk)
    monkeypatch.setattr(corpus_runs, "batch_task", counted)
    at.button(key="heads.corpus_go").click().run()
    assert not at.exception, at.exception
    second = at.session_state["heads.corpus:minilm"][0]
    assert second.complete and second.done == second.total == 5 and len(second.table) == 5
    assert sorted(ran) == sorted(set(range(5)) - set(first.table["item"]))   # only the texts not finished
    assert not list(folder.iterdir())                 # a complete run leaves no results file
    again = second.table[second.table["item"].isin(first.table["item"])].reset_index(drop=True)
    pd.testing.assert_frame_equal(again, first.table.reset_index(drop=True))   # NaN scores compare equal here


def test_the_corpus_tool_prices_a_run_before_it_starts_and_from_its_own_rate_after(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTNVIZ_SCHEDULER", raising=False)
    monkeypatch.setenv("ATTNVIZ_PRIVATE_DIR", str(tmp_path / "private"))
    at = corpus_tool()
    at.selectbox(key="heads.corpus_kind").set_value("pruning_curve").run()
    at.selectbox(key="heads.corpus_n").set_value(5).run()
    assert not at.exception
    (before,) = [c.value for c in at.caption if c.value.startswith("Estimate:")]
    assert "FLOP: about" in before and "matmul peak" in before and "the budget is 300 s" in before
    at.selectbox(key="heads.corpus_kind").set_value("mask").run()
    at.button(key="heads.corpus_go").click().run()
    assert not at.exception, at.exception
    result = at.session_state["heads.corpus:minilm"][0]
    assert result.complete and result.extra["estimate"]["rate"] > 0
    assert at.session_state["heads.corpus_rate:minilm"] > 0          # the rate this run measured here
    at.run()
    (after,) = [c.value for c in at.caption if c.value.startswith("Estimate:")]
    assert "the rate the last run of this model measured here" in after


def test_gemma_runs_over_the_bundled_chinese_django_messages(monkeypatch):
    """Gemma 3 270M reads Chinese: the Corpus tool runs it over real Chinese sentences (Django's
    translators'), the corpus that "prune 30 % of heads" can be asked over in Chinese."""
    from attnviz.analysis import corpus
    monkeypatch.delenv("ATTNVIZ_SCHEDULER", raising=False)
    zh = corpus.open_corpus("django-zh")
    assert len(zh) == 50 and all(t.endswith("。") for t in zh.items) and "BSD" in zh.licence
    at = AppTest.from_file(PAGE, default_timeout=600).run()
    at.selectbox(key="model_choice:encoder/lm").set_value("gemma3-270m").run()
    at.button_group(key="heads.tool").set_value("Corpus").run()
    at.selectbox(key="heads.corpus_pick").set_value("django-zh").run()
    at.selectbox(key="heads.corpus_kind").set_value("mask").run()
    at.selectbox(key="heads.corpus_n").set_value(5).run()
    at.button(key="heads.corpus_go").click().run()
    assert not at.exception, at.exception
    result = at.session_state["heads.corpus:gemma3-270m"][0]
    assert result.complete and result.corpus_key == "django-zh", [e.value for e in at.error]
    assert len(result.table) == 5
    assert at.get("plotly_chart")


def test_the_halving_run_is_named_for_the_model_and_answers_with_the_pi_saving(monkeypatch):
    """Before: "heads 4 vs 8" on a model of 12 heads a layer, and a table to read."""
    monkeypatch.delenv("ATTNVIZ_SCHEDULER", raising=False)
    at = corpus_tool()
    kind = at.selectbox(key="heads.corpus_kind")
    assert "each layer's 12 heads halved to 6" in kind.options
    kind.set_value("heads_4_vs_8").run()
    at.selectbox(key="heads.corpus_n").set_value(5).run()
    at.button(key="heads.corpus_go").click().run()
    assert not at.exception, at.exception
    said = next(i.value for i in at.info if i.value.startswith("Each layer's 12 heads halved to 6"))
    assert "[95 % CI" in said and "over 5 items" in said
    assert "on a Pi 4 (" in said and "modelled ±25%)" in said
