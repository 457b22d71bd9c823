"""AppTest of the home page and the Attention page: no exception, the detail heatmap is exactly the
captured attention, statistics present, friendly handling of empty and odd text."""
import base64
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from attnviz.analysis import head_ranking
from attnviz.analysis import stats
from attnviz.ui import common

ROOT = Path(__file__).resolve().parents[1]
PAGE = str(ROOT / "pages" / "1_Attention.py")
HOME = str(ROOT / "app.py")
PICKER = "model_choice:encoder/lm"


def _array(value) -> np.ndarray:
    """A plotly JSON array: a plain list, or {"dtype", "bdata", "shape"} base64 (plotly >= 6)."""
    if isinstance(value, dict) and "bdata" in value:
        data = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        if isinstance(shape, str):
            shape = [int(s) for s in shape.split(",")]
        return data.reshape(shape) if shape else data
    return np.asarray(value, dtype=float)


def _chart(at, key: str) -> dict:
    import json

    for chart in at.get("plotly_chart"):
        if chart.proto.id.endswith("-" + key):
            return json.loads(chart.proto.spec)
    raise AssertionError(f"no plotly chart with key {key!r}")


def _stats_table(at):
    tables = [d.value for d in at.dataframe if "entropy" in d.value.columns]
    assert len(tables) == 1, [list(d.value.columns) for d in at.dataframe]
    return tables[0]


def _rank_table(at):
    for frame in at.dataframe:
        if frame.proto.id.endswith("-attention.rank_table"):
            return frame.value
    raise AssertionError("no head ranking table")


def _run(at):
    at.run()
    assert not at.exception, at.exception
    return at


def _view(at, name: str):
    """Choose one of the page's views (only the chosen view is drawn and computed)."""
    at.radio(key="attention.view").set_value(name)
    return _run(at)


def _submit(at, text: str):
    at.text_area(key="attention.text_input").input(text)
    at.button[0].click()          # the form's Run button
    return _run(at)


@pytest.fixture(scope="module")
def page():
    return _run(AppTest.from_file(PAGE, default_timeout=180))


def test_home_page_describes_and_shows_shape():
    at = _run(AppTest.from_file(HOME, default_timeout=120))
    links = [p.proto.label for p in at.get("page_link")]   # each page's card is a link to it
    assert any("Attention" in label for label in links) and any("Heads" in label for label in links)
    shape = " ".join(c.value for c in at.caption)
    assert "6 layers × 12 heads" in shape and "512 positions" in shape


def _check_detail_matches_trace(at, model_key: str, text: str, layer: int, head: int):
    model = common.shared_model(model_key)
    spec = _chart(at, "attention.detail")
    z = _array(spec["data"][0]["z"])
    expected = model.trace(text).attentions[layer, head].numpy()
    assert z.shape == expected.shape
    np.testing.assert_allclose(z, expected, rtol=0, atol=1e-6)
    ticks = spec["layout"]["yaxis"]["ticktext"]
    assert len(ticks) == expected.shape[0] or len(ticks) <= 60


def test_minilm_detail_is_the_trace_and_stats_present(page):
    at = page
    at.selectbox(key="attention.layer").set_value(3)
    at.selectbox(key="attention.head").set_value(7)
    _view(at, "Detail")
    text = at.session_state["attention.text"]
    _check_detail_matches_trace(at, "minilm", text, 3, 7)
    _view(at, "Statistics")
    table = _stats_table(at)
    assert len(table) == 6 * 12 and {"entropy", "role", "prev_share"} <= set(table.columns)
    _view(at, "Model output")
    assert any("Cosine similarity" in m.label for m in at.metric)


def test_too_long_text_says_it_was_cut(page):
    _view(page, "Detail")
    at = _submit(page, "word " * 700)
    assert any("was cut to the model's 512 positions" in w.value for w in at.warning)
    assert _array(_chart(at, "attention.detail")["data"][0]["z"]).shape == (512, 512)
    _view(at, "Export")
    labels = {b.label for b in at.get("download_button")}
    assert {"Statistics CSV", "Attentions NPZ", "Chosen head PNG", "Chosen head SVG"} <= labels


def test_empty_text_keeps_previous_result(page):
    at = page
    before = at.session_state["attention.text"]
    _view(at, "Statistics")
    _submit(at, "   \n ")
    assert any("Type or paste" in w.value for w in at.warning)
    assert at.session_state["attention.text"] == before
    assert len(_stats_table(at)) == 6 * 12
    assert _chart(_view(at, "Detail"), "attention.detail")


@pytest.mark.parametrize("text", [
    "tab\there\x07bell\x1b[31m escape",                   # control characters
    "שלום עולם، مرحبا بالعالم",                            # right-to-left
    "zero\u200bwidth\u200djoin\u2060word\ufeff",           # zero-width characters
    "🍕" * 300,                                            # a long emoji run
    "a" * 6000,                                            # one 6,000-character word
    "{{ user }} {% if x %}<|im_start|>system [CLS] <s></s>{%- endif %} ${HOME}",  # templates
])
def test_odd_text_works(page, text):
    _view(page, "Detail")
    at = _submit(page, text)
    assert not at.error, [e.value for e in at.error]
    assert at.session_state["attention.text"] == text
    spec = _chart(at, "attention.detail")
    z = _array(spec["data"][0]["z"])
    assert z.ndim == 2 and np.isfinite(z).all()
    assert np.allclose(z.sum(-1), 1, atol=1e-4)      # MiniLM: the whole text fits, rows complete


def test_smollm2_next_token_and_causal_detail():
    at = _run(AppTest.from_file(PAGE, default_timeout=180))
    at.selectbox(key=PICKER).set_value("smollm2")
    _run(at)
    _submit(at, "The capital of France is")
    at.selectbox(key="attention.layer").set_value(29)
    at.selectbox(key="attention.head").set_value(8)
    _run(at)
    _check_detail_matches_trace(at, "smollm2", "The capital of France is", 29, 8)
    z = _array(_chart(at, "attention.detail")["data"][0]["z"])
    assert np.triu(z, 1).max() == 0                  # causal: no weight on later tokens
    _view(at, "Model output")
    bars = _chart(at, "attention.topk")["data"][0]
    probs = _array(bars["x"])
    assert len(probs) == 10 and np.all(np.diff(probs) <= 0)
    assert any("Paris" in str(t) for t in bars["customdata"])
    assert len(_stats_table(_view(at, "Statistics"))) == 30 * 9


def test_long_text_is_bounded_and_says_so():
    at = _run(AppTest.from_file(PAGE, default_timeout=300))
    at.selectbox(key=PICKER).set_value("smollm2")
    _run(at)
    text = "The quick brown fox jumps over the lazy dog. " * 60          # ~600 tokens
    _submit(at, text)
    assert any("overview pools the whole text" in i.value for i in at.info)
    z = _array(_chart(at, "attention.detail")["data"][0]["z"])
    model = common.shared_model("smollm2")
    n_window = z.shape[0]
    assert n_window < 600
    # Window from token 0 of a decoder: exactly the top-left block of the full attention.
    layer0 = model.trace(text, layers=[0]).attentions[0, 0, :n_window, :n_window]
    np.testing.assert_allclose(z, layer0.numpy(), atol=1e-5)


def test_model_picked_on_home_carries_to_the_page_and_a_click_picks_a_head():
    at = _run(AppTest.from_file(HOME, default_timeout=180))
    at.selectbox(key="model_choice:encoder/lm/vision").set_value("smollm2")
    _run(at)
    assert [m.value for m in at.metric] == ["30", "9", "3", "8,192"]
    at.switch_page("pages/1_Attention.py")
    _run(at)
    assert at.selectbox(key=PICKER).value == "smollm2"
    # What Streamlit stores after a click on the overview (the points' customdata is [layer, head, role]).
    at.session_state["attention.overview"] = {"selection": {"points": [{"customdata": [4, 5, "sink"]}]}}
    _run(at)
    assert (at.selectbox(key="attention.layer").value, at.selectbox(key="attention.head").value) == (4, 5)
    assert _chart(at, "attention.detail")["layout"]["title"]["text"] == "Layer 4, head 5"


def _shown(selectbox, before: str) -> str:
    """The label a browser shows after a rerun: the value the server sends (set_value), else the
    label the browser already had (Streamlit keeps a keyed widget's state across option changes)."""
    return selectbox.proto.raw_value if selectbox.proto.set_value else before


def _smollm2_page():
    at = _run(AppTest.from_file(PAGE, default_timeout=300))
    at.selectbox(key=PICKER).set_value("smollm2")
    return _run(at)


def test_next_token_position_follows_a_new_text():
    """After a second, shorter text the selector read "After position 50: ." while
    the bars showed the last token. The position is reset to the new text's last token and the
    browser is told; the bars name the position they are for."""
    at = _view(_smollm2_page(), "Model output")
    _submit(at, "One two three four five six seven eight nine ten. " * 6)    # 66 tokens
    at.selectbox(key="attention.pos").set_value(50)
    _run(at)
    position = at.selectbox(key="attention.pos")
    shown = position.options[50]
    assert _chart(at, "attention.topk")["layout"]["title"]["text"] == f"Next token after {shown}, top 10"
    _submit(at, "The capital of France is Paris, and the capital of Italy is")
    position = at.selectbox(key="attention.pos")
    assert len(position.options) < 50
    shown = _shown(position, shown)
    assert shown == position.options[-1] and position.value == len(position.options) - 1
    assert _chart(at, "attention.topk")["layout"]["title"]["text"] == f"Next token after {shown}, top 10"


def test_find_heads_ranks_every_head_and_a_selected_row_opens_it():
    at = _view(_run(AppTest.from_file(PAGE, default_timeout=180)), "Find heads")
    text = at.session_state["attention.text"]
    labels = [o.split(": ", 1)[1] for o in at.selectbox(key="attention.rank_q").options]
    query, key = labels.index("it"), labels.index("animal")
    at.selectbox(key="attention.rank_q").set_value(query)
    at.selectbox(key="attention.rank_k").set_value(key)
    _run(at)
    table = _rank_table(at)
    tr = common.shared_model("minilm").trace(text)
    content = [i for i, t in enumerate(tr.tokens) if t not in ("[CLS]", "[SEP]")]
    expected = head_ranking.rank_heads(tr.attentions, query, key, content=content)
    assert len(table) == 6 * 12 and table["rank"].tolist() == list(range(1, 73))
    assert table[["layer", "head"]].values.tolist() == expected[["layer", "head"]].values.tolist()
    np.testing.assert_allclose(table["weight"], expected["weight"], atol=1e-6)
    np.testing.assert_allclose(table["contrast"], expected["contrast"], atol=1e-6)
    bars = _chart(at, "attention.rank_bars")
    assert bars["layout"]["title"]["text"] == "Top heads: it → animal"
    # the answer as a sentence: MiniLM's layer 3, head 1 sends 0.68 of "it" to "animal", and is
    # labelled a link for that query (over all queries its role is a sink)
    said = [m.value.replace("\\", "") for m in at.markdown if "links" in m.value]
    assert said and said[0].startswith("Layer 3, head 1 links “it” to “animal”: it sends 0.68")
    assert table.iloc[0]["pattern"] == "link" and "sink" not in table.iloc[0].to_string()
    # Selecting a row opens that head in the selectors and the detail heatmap.
    at.session_state["attention.rank_table"] = {"selection": {"rows": [2], "columns": [], "cells": []}}
    _run(at)
    layer, head = (int(v) for v in table.loc[2, ["layer", "head"]])
    assert (at.selectbox(key="attention.layer").value, at.selectbox(key="attention.head").value) == (layer, head)
    assert _chart(_view(at, "Detail"), "attention.detail")["layout"]["title"]["text"] == \
        f"Layer {layer}, head {head}"
    # Back on the ranking its pair is remembered; another pair clears the stale selection and
    # leaves the head where it is.
    _view(at, "Find heads")
    assert (at.selectbox(key="attention.rank_q").value, at.selectbox(key="attention.rank_k").value) \
        == (query, key)
    at.selectbox(key="attention.rank_k").set_value(0)
    _run(at)
    assert list(at.session_state["attention.rank_table"]["selection"]["rows"]) == []
    assert (at.selectbox(key="attention.layer").value, at.selectbox(key="attention.head").value) == (layer, head)


def test_lines_follow_the_chosen_head_and_name_its_layer(page):
    at = _view(page, "Lines")
    at.selectbox(key="attention.layer").set_value(2)
    at.selectbox(key="attention.head").set_value(5)
    _run(at)

    def lines():
        spec = _chart(at, "attention.lines")
        legend = [t["name"] for t in spec["data"] if t.get("mode") == "lines"
                  and t.get("hoverinfo") != "skip"]
        return spec["layout"]["title"]["text"], legend

    assert lines() == ("Layer 2, head 5", ["head 5"])
    at.multiselect(key="attention.line_extra").select(3)
    _run(at)
    assert lines() == ("Layer 2, heads 5, 3", ["head 5", "head 3"])
    at.selectbox(key="attention.head").set_value(7)
    _run(at)
    assert lines() == ("Layer 2, head 7", ["head 7"])            # extra heads belong to the old one


def test_text_outside_the_vocabulary_is_warned(page):
    at = _submit(page, "Привет, как дела? Это тестовое предложение на русском языке.")
    assert any("outside minilm's vocabulary" in w.value for w in at.warning)
    at = _submit(page, "🍕🍕🐈 😀")
    assert any("outside minilm's vocabulary" in w.value for w in at.warning)
    at = _submit(page, "The weather is lovely today, so we walked along the river.")
    assert not any("vocabulary" in w.value for w in at.warning)


def test_long_capture_over_its_time_limit_or_on_a_busy_server_keeps_the_previous_result(
        monkeypatch, set_limits):
    """A long scan stops at LIMITS.max_capture_seconds, and holds a heavy-job slot."""
    import contextlib
    import dataclasses

    from attnviz.base import jobs
    from attnviz.analysis import capture

    at = _view(_smollm2_page(), "Detail")
    short = "The capital of France is"
    _submit(at, short)
    set_limits(max_capture_seconds=0.0)
    long_text = " ".join(f"Sentence number {i} of a text that needs the long scan." for i in range(40))
    _submit(at, long_text)
    errors = [e.value for e in at.error]
    assert any("time limit of 0 s" in e and "shorter text" in e for e in errors), errors
    assert at.session_state["attention.text"] == short                  # the previous result stays
    assert at.text_area(key="attention.text_input").value == long_text  # and so does what was typed
    _check_detail_matches_trace(at, "smollm2", short, 0, 0)
    monkeypatch.undo()
    with contextlib.ExitStack() as stack:                          # every heavy-job slot taken
        for i in range(jobs.LIMITS.max_heavy_jobs):
            stack.enter_context(jobs.heavy_job(f"someone's sweep {i}"))
        at.button[0].click()
        _run(at)
    errors = [e.value for e in at.error]
    assert any("at most" in e and "again in a moment" in e for e in errors), errors
    assert at.session_state["attention.text"] == short
    assert jobs.running_jobs() == []


def test_statistics_csv_is_spreadsheet_safe_and_token_text_is_plain(monkeypatch):
    """CSV downloads go through exports.csv_text; tokens shown as markdown are escaped."""
    from attnviz.base import exports

    made = []
    real = exports.csv_text
    monkeypatch.setattr(exports, "csv_text", lambda df, **kw: made.append(list(df.columns))
                        or real(df, **kw))
    at = _run(AppTest.from_file(PAGE, default_timeout=180))
    _submit(at, "**bold** [link](javascript:alert(1)) =cmd")
    _view(at, "Statistics")
    _view(at, "Export")
    assert sum("entropy" in columns for columns in made) >= 2    # both Statistics CSV buttons
    caption = next(c.value for c in at.caption if " tokens: " in c.value)
    assert "\\*" in caption and "\\[" in caption and "\\(" in caption


def test_head_scores_table_is_the_library_table_and_a_row_opens_its_head():
    """Previous-token, induction and duplicate-token scores of every head of the LM, a
    sortable table whose selected row opens the head; encoders are told why there is none."""
    from attnviz.analysis import head_scores

    at = _view(_run(AppTest.from_file(PAGE, default_timeout=180)), "Head scores")   # MiniLM: no scores
    assert any("causal language models" in i.value for i in at.info)
    at = _view(_smollm2_page(), "Head scores")
    at.number_input(key="attention.hs_T").set_value(20)
    at.number_input(key="attention.hs_n").set_value(2)
    next(b for b in at.button if b.proto.label == "Compute head scores").click()
    _run(at)
    table = next(d.value for d in at.dataframe if d.proto.id.endswith("-attention.hs_table"))
    expected = head_scores.head_scores(common.shared_model("smollm2"), 20, 2, 0)
    assert list(table.columns) == ["layer", "head", "previous_token", "induction", "duplicate_token"]
    assert len(table) == 30 * 9
    np.testing.assert_allclose(table[["previous_token", "induction", "duplicate_token"]].to_numpy(),
                               expected[["previous_token", "induction", "duplicate_token"]].to_numpy(),
                               atol=1e-6)
    assert table["induction"].max() > 0.5            # SmolLM2 has real induction heads
    best = int(table["induction"].idxmax())
    at.session_state["attention.hs_table"] = {"selection": {"rows": [best], "columns": [], "cells": []}}
    _run(at)
    layer, head = (int(v) for v in table.loc[best, ["layer", "head"]])
    assert (at.selectbox(key="attention.layer").value, at.selectbox(key="attention.head").value) == (layer, head)
    assert at.radio(key="attention.view").value == "Head scores"    # the view stays where it was


def test_only_the_chosen_view_computes_and_the_choice_outlives_buttons(monkeypatch):
    """Every rerun computed all eight tabs (the whole statistics table, rollout,
    ranking) whatever was shown. Now the Detail view computes one head's statistics only, the
    rollout only when its view is chosen, and the chosen view survives other widgets' reruns."""
    calls = {"stats": [], "rollout": 0}
    real_stats, real_rollout = stats.head_stats, stats.rollout

    def counting_stats(attn, *args, **kwargs):
        calls["stats"].append(tuple(attn.shape[:2]))
        return real_stats(attn, *args, **kwargs)

    def counting_rollout(*args, **kwargs):
        calls["rollout"] += 1
        return real_rollout(*args, **kwargs)

    monkeypatch.setattr(stats, "head_stats", counting_stats)
    monkeypatch.setattr(stats, "rollout", counting_rollout)
    at = _run(AppTest.from_file(PAGE, default_timeout=180))
    _submit(at, "A sentence nobody else in these tests types, about seven blue herons.")
    assert at.radio(key="attention.view").value == "Detail"
    assert calls["stats"] and set(calls["stats"]) == {(1, 1)}       # one head, never all 72
    assert calls["rollout"] == 0
    _view(at, "Rollout & flow")
    assert calls["rollout"] == 1 and _chart(at, "attention.rollout")
    at.selectbox(key="attention.head").set_value(4)                # another widget's rerun
    _run(at)
    assert at.radio(key="attention.view").value == "Rollout & flow" and _chart(at, "attention.flow")
    assert calls["rollout"] == 1                                   # kept in the shared cache
    assert (6, 12) not in calls["stats"]


def test_detail_caption_names_the_mean_of_row_maxima_and_the_brightest_cell(page):
    """The caption's "max weight 0.19" was the mean of the row maxima beside a 0.35 cell."""
    at = _view(page, "Detail")
    z = _array(_chart(at, "attention.detail")["data"][0]["z"])
    caption = " ".join(c.value for c in at.caption if "entropy" in c.value)
    assert "mean of row maxima" in caption and "max weight" not in caption
    assert f"brightest cell {np.nanmax(z):.2f}" in caption


def test_byte_level_vocabulary_warning_speaks_of_bytes_not_unk():
    """SmolLM2 has no [UNK]; it splits characters into bytes."""
    at = _submit(_smollm2_page(), "Привет, как дела? Это тестовое предложение на русском языке.")
    warning = [w.value for w in at.warning if "vocabulary" in w.value]
    assert warning and "bytes" in warning[0] and "[UNK]" not in warning[0]


def test_home_lists_every_page_with_a_thumbnail_and_the_model_table_fits():
    """One line and a thumbnail per page; the model table has few, bounded columns."""
    import json

    at = _run(AppTest.from_file(HOME, default_timeout=120))
    pages = sorted(p.stem.split("_", 1)[1] for p in (ROOT / "pages").glob("*.py"))
    links = [p.proto.label for p in at.get("page_link")]
    for name in pages:
        assert any(label.endswith(f". {name}**") for label in links), name
    assert len(at.get("image")) == len(pages)
    table = [d for d in at.dataframe if "licence" in d.value.columns][0]
    config = json.loads(table.proto.columns)
    assert len(table.value.columns) <= 7   # model, task, chinese, shape, positions, source, licence
    assert all(config[c].get("width") in ("small", "medium", "large") for c in table.value.columns)


def test_find_heads_opens_on_it_and_the_noun_it_refers_to():
    """The default pair was the last and the first token ("." → "the")."""
    at = _view(_run(AppTest.from_file(PAGE, default_timeout=180)), "Find heads")
    q, k = at.selectbox(key="attention.rank_q"), at.selectbox(key="attention.rank_k")
    assert q.options[q.index].endswith(": it") and k.options[k.index].endswith(": animal")
    ranking = _rank_table(at)
    top = ranking.iloc[0]
    assert top["key_rank"] == 1 and top["weight"] > 0.3      # a head that really links them
    _view(at, "Model output")
    assert any("mean-pooled" in c.value and "second sentence" in c.value for c in at.caption)


def test_head_scores_also_as_a_layer_by_head_map():
    """The head scores as a layer × head map, beside the table."""
    at = _view(_smollm2_page(), "Head scores")
    at.number_input(key="attention.hs_T").set_value(8)
    at.number_input(key="attention.hs_n").set_value(1)
    next(b for b in at.button if b.proto.label == "Compute head scores").click()
    _run(at)
    table = next(d.value for d in at.dataframe if d.proto.id.endswith("-attention.hs_table"))
    z = _array(_chart(at, "attention.hs_grid")["data"][0]["z"])
    assert z.shape == (30, 9)
    np.testing.assert_allclose(z, table.pivot(index="layer", columns="head",
                                              values="previous_token").to_numpy(), atol=1e-6)
