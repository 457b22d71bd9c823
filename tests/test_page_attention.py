"""AppTest of the home page and the Attention page: no exception, the detail heatmap is exactly the
captured attention, statistics present, friendly handling of empty and odd text."""
import base64
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from attnviz import ui

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


def _run(at):
    at.run()
    assert not at.exception, at.exception
    return at


def _submit(at, text: str):
    at.text_area(key="att_text_input").input(text)
    at.button[0].click()          # the form's Run button
    return _run(at)


@pytest.fixture(scope="module")
def page():
    return _run(AppTest.from_file(PAGE, default_timeout=180))


def test_home_page_describes_and_shows_shape():
    at = _run(AppTest.from_file(HOME, default_timeout=120))
    text = " ".join(m.value for m in at.markdown)
    assert "Attention" in text and "Heads" in text
    shape = " ".join(c.value for c in at.caption)
    assert "6 layers × 12 heads" in shape and "512 positions" in shape


def _check_detail_matches_trace(at, model_key: str, text: str, layer: int, head: int):
    model = ui.load_model(model_key)
    spec = _chart(at, "att_detail")
    z = _array(spec["data"][0]["z"])
    expected = model.trace(text).attentions[layer, head].numpy()
    assert z.shape == expected.shape
    np.testing.assert_allclose(z, expected, rtol=0, atol=1e-6)
    ticks = spec["layout"]["yaxis"]["ticktext"]
    assert len(ticks) == expected.shape[0] or len(ticks) <= 60


def test_minilm_detail_is_the_trace_and_stats_present(page):
    at = page
    at.selectbox(key="att_layer").set_value(3)
    at.selectbox(key="att_head").set_value(7)
    _run(at)
    text = at.session_state["att_text"]
    _check_detail_matches_trace(at, "minilm", text, 3, 7)
    table = at.dataframe[0].value
    assert len(table) == 6 * 12 and {"entropy", "role", "prev_share"} <= set(table.columns)
    assert any("Cosine similarity" in m.label for m in at.metric)


def test_too_long_text_says_it_was_cut(page):
    at = _submit(page, "word " * 700)
    assert any("was cut to the model's 512 positions" in w.value for w in at.warning)
    assert _array(_chart(at, "att_detail")["data"][0]["z"]).shape == (512, 512)
    labels = {b.label for b in at.get("download_button")}
    assert {"Statistics CSV", "Attentions NPZ", "Chosen head PNG", "Chosen head SVG"} <= labels


def test_empty_text_keeps_previous_result(page):
    at = page
    before = at.session_state["att_text"]
    _submit(at, "   \n ")
    assert any("Type or paste" in w.value for w in at.warning)
    assert at.session_state["att_text"] == before
    assert len(at.dataframe) == 1 and _chart(at, "att_detail")


@pytest.mark.parametrize("text", [
    "tab\there\x07bell\x1b[31m escape",                   # control characters
    "שלום עולם، مرحبا بالعالم",                            # right-to-left
    "zero\u200bwidth\u200djoin\u2060word\ufeff",           # zero-width characters
    "🍕" * 300,                                            # a long emoji run
    "a" * 6000,                                            # one 6,000-character word
    "{{ user }} {% if x %}<|im_start|>system [CLS] <s></s>{%- endif %} ${HOME}",  # templates
])
def test_odd_text_works(page, text):
    at = _submit(page, text)
    assert not at.error, [e.value for e in at.error]
    assert at.session_state["att_text"] == text
    spec = _chart(at, "att_detail")
    z = _array(spec["data"][0]["z"])
    assert z.ndim == 2 and np.isfinite(z).all()
    assert np.allclose(z.sum(-1), 1, atol=1e-4)      # MiniLM: the whole text fits, rows complete


def test_smollm2_next_token_and_causal_detail():
    at = _run(AppTest.from_file(PAGE, default_timeout=180))
    at.selectbox(key=PICKER).set_value("smollm2")
    _run(at)
    _submit(at, "The capital of France is")
    at.selectbox(key="att_layer").set_value(29)
    at.selectbox(key="att_head").set_value(8)
    _run(at)
    _check_detail_matches_trace(at, "smollm2", "The capital of France is", 29, 8)
    z = _array(_chart(at, "att_detail")["data"][0]["z"])
    assert np.triu(z, 1).max() == 0                  # causal: no weight on later tokens
    bars = _chart(at, "att_topk")["data"][0]
    probs = _array(bars["x"])
    assert len(probs) == 10 and np.all(np.diff(probs) <= 0)
    assert any("Paris" in str(t) for t in bars["customdata"])
    assert len(at.dataframe[0].value) == 30 * 9


def test_long_text_is_bounded_and_says_so():
    at = _run(AppTest.from_file(PAGE, default_timeout=300))
    at.selectbox(key=PICKER).set_value("smollm2")
    _run(at)
    text = "The quick brown fox jumps over the lazy dog. " * 60          # ~600 tokens
    _submit(at, text)
    assert any("overview pools the whole text" in i.value for i in at.info)
    z = _array(_chart(at, "att_detail")["data"][0]["z"])
    model = ui.load_model("smollm2")
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
    at.session_state["att_overview"] = {"selection": {"points": [{"customdata": [4, 5, "sink"]}]}}
    _run(at)
    assert (at.selectbox(key="att_layer").value, at.selectbox(key="att_head").value) == (4, 5)
    assert _chart(at, "att_detail")["layout"]["title"]["text"] == "Layer 4, head 5"
