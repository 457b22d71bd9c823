"""Views you can share: the saved-view file's round trip and its checks, the link's query, and
(AppTest) values from an opened file reaching the widgets of a view not yet drawn."""
import json
import math
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from streamlit.testing.v1 import AppTest

from attnviz.ui import shared_view

READOUTS = str(Path(__file__).resolve().parents[1] / "pages" / "8_Readouts.py")
LAB = str(Path(__file__).resolve().parents[1] / "pages" / "5_Lab.py")
STATE = {"attention.layer": 2, "attention.head": 3, "attention.view": "Lines", "attention.per_head": False,
         "attention.text": "x" * 5000, "model_choice:encoder/lm": "minilm", "heads": "6x12-fff"}


def test_a_saved_view_reads_back_exactly():
    data = shared_view.view_file("attention", STATE)
    doc = json.loads(data)
    assert doc["schema"] == shared_view.SCHEMA and doc["page"] == "attention" and doc["app"] == "attnviz view"
    state, ignored = shared_view.read_view_file(data, "attention")
    assert state == STATE and ignored == []
    assert state["attention.text"] == "x" * 5000        # the full text, however long


def test_unknown_names_are_ignored_and_listed():
    data = shared_view.view_file("attention", {**STATE, "heads.layer": 1, "colour": "red"})
    state, ignored = shared_view.read_view_file(data, "attention")
    assert state == STATE and sorted(ignored) == ["colour", "heads.layer"]


@pytest.mark.parametrize("data, says", [
    (b"{not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "not a saved view of attnviz"),
    (json.dumps({"app": "other", "schema": 1}).encode(), "not a saved view of attnviz"),
    (json.dumps({"app": "attnviz view", "schema": 99, "page": "attention", "state": {}}).encode(), "schema 99"),
    (json.dumps({"app": "attnviz view", "schema": True, "page": "attention", "state": {}}).encode(), "schema True"),
    (json.dumps({"app": "attnviz view", "schema": 1, "page": "heads", "state": {}}).encode(), "'Heads' page"),
    (json.dumps({"app": "attnviz view", "schema": 1, "page": "attention", "state": [1]}).encode(), "\"state\""),
    (json.dumps({"app": "attnviz view", "schema": 1, "page": "attention",
                 "state": {"attention.layer": {"a": 1}}}).encode(), "'attention.layer' is dict"),
    (json.dumps({"app": "attnviz view", "schema": 1, "page": "attention",
                 "state": {"attention.extra": [[1]]}}).encode(), "'attention.extra' is list"),
    (json.dumps({"app": "attnviz view", "schema": 1, "page": "attention",
                 "state": {"heads": 7}}).encode(), "'heads' is int"),
    (b'{"app": "attnviz view", "schema": 1, "page": "attention", "state": {"attention.layer": NaN}}',
     "'attention.layer' is float"),
])
def test_a_bad_file_is_a_value_error_that_says_what_is_wrong(data, says):
    with pytest.raises(ValueError) as err:
        shared_view.read_view_file(data, "attention")
    assert says in str(err.value)


def test_an_oversized_file_or_text_is_refused(set_limits):
    with pytest.raises(ValueError, match="at most"):
        shared_view.read_view_file(b" " * (shared_view.FILE_BYTES + 1), "attention")
    set_limits(max_text_chars=10)
    data = shared_view.view_file("attention", {"attention.text": "y" * 11})
    with pytest.raises(ValueError, match="11 characters; at most 10"):
        shared_view.read_view_file(data, "attention")


def test_plain_values():
    assert all(shared_view.is_plain(v) for v in ("a", 1, 2.5, True, None, [1, "b", 2.0], []))
    assert not any(shared_view.is_plain(v) for v in ({}, [[1]], math.inf, math.nan, b"x", (1,), object()))


def test_the_link_drops_the_old_query_and_encodes_every_value():
    url = shared_view.link("http://host:8501/Attention?old=1#top",
                           {"attention.text": ["a & b = c?"], "attention.models": ["minilm", "smollm2"],
                            "empty": []})
    parts = urlsplit(url)
    assert parts.path == "/Attention" and not parts.fragment
    assert parse_qs(parts.query) == {"attention.text": ["a & b = c?"], "attention.models": ["minilm", "smollm2"]}


def test_link_params_are_the_sessions_values_with_their_labels():
    state = {"attention.layer": 4, "attention.per_head": False, "attention.hs_map": "prev_token",
             "attention.models": ["minilm"], "heads.layer": 1, "model_choice:encoder/lm": "minilm",
             shared_view.FORMATS: {"attention.layer": str, "attention.per_head": str, "heads.layer": str,
                                   "attention.hs_map": lambda c: c.replace("_", "-") + " score",
                                   "attention.models": str, "model_choice:encoder/lm": lambda k: f"{k} (bert)",
                                   "attention.gone": str}}
    params = shared_view.link_params("attention", state, {"heads": ["6x12-ff"], "attention.layer": ["1"]})
    assert params == {"heads": ["6x12-ff"], "attention.layer": ["4"], "attention.per_head": ["false"],
                      "attention.hs_map": ["prev-token score"], "attention.models": ["minilm"],
                      "model_choice:encoder/lm": ["minilm (bert)"]}


def test_restore_keeps_widget_values_for_their_widgets_and_sets_plain_texts():
    shared_view.saved("attention.text")               # a plain text (a form's box), not a widget
    ss = {"attention.layer": 0, "attention.go": False, "attention.text": "old"}
    params = {}
    left = shared_view.restore("attention", {"attention.layer": 5, "attention.go": True, "attention.text": "new",
                                             "attention.line_q": 3, "heads": "6x12-ff"}, ss, params)
    assert ss["attention.text"] == "new" and left == []
    assert ss["attention.layer"] == 0 and ss["attention.go"] is False    # set only as their widgets are drawn
    assert ss[shared_view.PENDING] == {"attention.layer": 5, "attention.go": True, "attention.line_q": 3}
    assert params == {"heads": "6x12-ff"}
    left = shared_view.restore("attention", {"attention.text": 7}, ss, params)
    assert ss["attention.text"] == "new" and left == [("attention.text", 7, "it is not text")]


def test_a_value_fits_only_what_its_widget_accepts():
    fits = shared_view.fits
    # a slider's or number_input's range and number kind
    assert fits(2.5, bounds=(0.1, 5.0)) == (2.5, None) and fits(2, bounds=(0.1, 5.0)) == (2.0, None)
    assert isinstance(fits(2, bounds=(0.1, 5.0))[0], float)
    assert "outside 0.1 to 5" in fits(1e308, bounds=(0.1, 5.0))[1]
    assert "outside" in fits(-1, bounds=(0, 11))[1] and fits(11, bounds=(0, 11)) == (11, None)
    assert "whole number" in fits(2.5, bounds=(0, 11))[1] and "whole number" in fits("3", bounds=(0, 11))[1]
    assert "not a number" in fits("3", bounds=(0.0, 1.0))[1]
    assert "true/false" in fits(True, bounds=(0, 11))[1]
    assert "whole number" in fits(2.0, bounds=(0, 11), kind=int)[1]
    # a choice among options: the option itself; a bool never stands for 1, nor None for a choice
    assert fits(2.0, options=range(4)) == (2, None) and fits("b", options=["a", "b"]) == ("b", None)
    assert "'c' is not one of its 2 choices" in fits("c", options=["a", "b"])[1]
    assert "not one of" in fits(True, options=[0, 1])[1] and "not one of" in fits(None, options=["a"])[1]
    # a multiselect's list of choices
    assert fits(["b", "a"], options=["a", "b"], kind=list) == (["b", "a"], None)
    assert fits([], options=["a"], kind=list) == ([], None)
    assert "not a list" in fits("a", options=["a"], kind=list)[1]
    assert "'z' is not one of" in fits(["a", "z"], options=["a"], kind=list)[1]
    assert "twice" in fits(["a", "a"], options=["a", "b"], kind=list)[1]
    # a toggle's bool, a text's type and length
    assert fits(False, kind=bool) == (False, None) and "not true/false" in fits(0, kind=bool)[1]
    assert fits("ab", kind=str, chars=2) == ("ab", None) and "3 characters" in fits("abc", kind=str, chars=2)[1]
    assert "not text" in fits(3, kind=str)[1] and "true/false" in fits(True, kind=str)[1]
    with pytest.raises(TypeError):
        fits(1)


def test_a_linked_widget_must_say_what_it_accepts():
    with pytest.raises(TypeError, match="needs what its widget accepts"):
        shared_view.linked("attention.nothing")


def test_an_opened_view_reaches_the_widgets_of_a_view_not_yet_drawn():
    at = AppTest.from_file(READOUTS, default_timeout=300).run()
    assert not at.exception
    assert at.radio(key="readouts.view").value == "Logit lens"
    at.session_state[shared_view.PENDING] = {"readouts.view": "Two prompts", "readouts.pair_a": "A cat sat.",
                                             "readouts.pair_b": "A dog sat."}
    at.run()
    assert not at.exception and not at.error
    assert at.radio(key="readouts.view").value == "Two prompts"
    assert at.text_area(key="readouts.pair_a").value == "A cat sat."
    assert at.text_area(key="readouts.pair_b").value == "A dog sat."
    state = shared_view.page_state("readouts", at.session_state, {})
    assert state["readouts.view"] == "Two prompts" and state["readouts.pair_b"] == "A dog sat."
    assert all(k.startswith(("readouts.", "model_choice:")) for k in state)
    assert shared_view.read_view_file(shared_view.view_file("readouts", state), "readouts")[0] == state


def test_a_view_nested_thousands_deep_is_a_message():
    deep = b'{"app": "attnviz view", "schema": 1, "page": "attention", "state": {"attention.layer": ' \
        + b"[" * 3000 + b"]" * 3000 + b"}}"
    with pytest.raises(ValueError, match="nested far deeper"):
        shared_view.read_view_file(deep, "attention")


def test_a_saved_text_holding_a_lone_surrogate_is_refused_when_opened():
    data = b'{"app": "attnviz view", "schema": 1, "page": "heads", "state": {"heads.text": "a \\ud800 b"}}'
    with pytest.raises(ValueError, match="'heads.text' is str"):
        shared_view.read_view_file(data, "heads")
    assert not shared_view.is_plain(["ok", "\udfff"])


def open_lab_view(state: dict) -> AppTest:
    """The Lab page with a saved view of `state` opened in the sidebar's Share this view."""
    at = AppTest.from_file(LAB, default_timeout=300).run()
    assert not at.exception, at.exception
    at.session_state["shared_view.open"] = True           # the box that holds the uploader
    at.run()
    data = shared_view.view_file("lab", state)
    at.sidebar.file_uploader(key="lab.share_open").set_value(("view.json", data, "application/json")).run()
    assert not at.exception, at.exception
    return at


def notes(at) -> str:
    return " | ".join(e.value for e in [*at.sidebar.success, *at.sidebar.warning, *at.sidebar.error])


def test_an_out_of_range_number_in_a_saved_view_is_left_out_with_a_note_and_the_rest_applied():
    at = open_lab_view({"lab.temp": 1e308, "lab.steps_mode": "All steps", "lab.layer": 1})
    assert at.slider(key="lab.temp").value == 1.0                 # the slider keeps its default
    assert "Left out lab.temp = 1e+308: it is outside 0.1 to 5" in notes(at)
    assert at.radio(key="lab.steps_mode").value == "All steps" and at.number_input(key="lab.layer").value == 1
    assert not at.error


def test_a_choice_not_among_a_selectbox_options_is_left_out_and_the_rest_applied():
    at = open_lab_view({"lab.view": "Toy transformers", "lab.toy_source": "train one now",
                        "lab.toy_task": "no-such-task", "lab.toy_len": 99, "lab.toy_heads": 8})
    assert at.selectbox(key="lab.toy_task").value == "copy"      # its default
    assert at.slider(key="lab.toy_len").value == 8 and at.select_slider(key="lab.toy_heads").value == 8
    assert "Left out lab.toy_task = 'no-such-task': 'no-such-task' is not one of its" in notes(at)
    assert "Left out lab.toy_len = 99: it is outside 2 to 16" in notes(at)


def test_a_valid_saved_view_applies_every_value():
    state = {"lab.view": "Toy transformers", "lab.toy_source": "train one now", "lab.toy_task": "sort",
             "lab.toy_heads": 8, "lab.toy_len": 6, "lab.toy_layers": 3, "lab.toy_width": 32,
             "lab.toy_pos": "rotary", "lab.toy_var": "linear", "lab.toy_steps": 150, "lab.toy_ckpt": True}
    at = open_lab_view(state)
    assert "Opened view.json: 11 value(s) read." in notes(at) and "Left out" not in notes(at)
    assert not at.sidebar.warning and not at.sidebar.error
    assert at.selectbox(key="lab.toy_task").value == "sort" and at.select_slider(key="lab.toy_heads").value == 8
    assert at.slider(key="lab.toy_len").value == 6 and at.slider(key="lab.toy_layers").value == 3
    assert at.select_slider(key="lab.toy_width").value == 32 and at.selectbox(key="lab.toy_pos").value == "rotary"
    assert at.selectbox(key="lab.toy_var").value == "linear" and at.number_input(key="lab.toy_steps").value == 150
    assert at.toggle(key="lab.toy_ckpt").value is True
    assert {k: at.session_state[k] for k in state} == state
