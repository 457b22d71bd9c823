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


def test_restore_sets_values_of_their_kind_and_keeps_the_rest_for_later():
    ss = {"attention.layer": 0, "attention.go": False, "attention.text": "old"}
    params = {}
    shared_view.restore("attention", {"attention.layer": 5, "attention.go": True, "attention.text": "new",
                                      "attention.line_q": 3, "heads": "6x12-ff"}, ss, params)
    assert ss["attention.layer"] == 5 and ss["attention.text"] == "new"
    assert ss["attention.go"] is False                 # a bool only for a linked widget (a button's is not)
    assert ss[shared_view.PENDING] == {"attention.go": True, "attention.line_q": 3}
    assert params == {"heads": "6x12-ff"}


def test_same_kind():
    assert shared_view.same_kind(1, 2.5) and shared_view.same_kind("a", "b") and shared_view.same_kind([1], [])
    assert not shared_view.same_kind(False, True) and not shared_view.same_kind(1, "1")
    assert not shared_view.same_kind(0, True)


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
