"""The patching views in AppTest: an encoder's embedding metric and path patching on the Readouts
page, and the Translate page's patching section; each cell read off the page equals the library's."""
import json
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from attnviz.analysis import patching, patching_paths, patching_translate
from attnviz.weights import catalogue

ROOT = Path(__file__).resolve().parents[1]
READOUTS, TRANSLATE = str(ROOT / "pages" / "8_Readouts.py"), str(ROOT / "pages" / "6_Translate.py")
PICKER = "model_choice:encoder/lm"


def chart(at, key):
    return json.loads(next(c for c in at.get("plotly_chart") if c.key == key).proto.spec)


def readouts(model_key: str) -> AppTest:
    at = AppTest.from_file(READOUTS, default_timeout=300)
    at.session_state[PICKER] = model_key
    at.run()
    at.radio(key="readouts.view").set_value("Patching").run()
    assert not at.exception and not at.error
    return at


def test_minilm_patching_with_the_embedding_distance():
    at = readouts("minilm")
    assert at.radio(key="readouts.view").options == ["Patching"]
    assert not [t for t in at.text_input if t.key == "readouts.patch_target"]     # no logits, no tokens
    at.radio(key="readouts.patch_kind").set_value("z").run()
    at.button(key="readouts.patch_run").click().run()
    assert not at.exception and not at.error
    z = chart(at, "readouts.patch_map")["data"][0]["z"]
    model = catalogue.load_model("minilm")
    pair = patching.prepare(model, patching.SAMPLE_CLEAN, patching.SAMPLE_CORRUPTED, metric="distance")
    want = patching.patch_map(model, pair, "z", units={2: [5]})
    assert abs(z[2][5] - float(want.recovered[2, 5])) < 1e-4
    at.radio(key="readouts.patch_metric").set_value("cosine").run()
    assert not at.exception and not at.get("plotly_chart")      # a new metric is a new question


def test_path_patching_view_on_smollm2():
    at = readouts("smollm2")
    at.radio(key="readouts.patch_kind").set_value("path").run()
    at.selectbox(key="readouts.patch_recv_layer").set_value(2).run()
    at.radio(key="readouts.patch_recv_kind").set_value("k").run()
    at.selectbox(key="readouts.patch_recv_group").set_value(1).run()
    at.button(key="readouts.patch_run").click().run()
    assert not at.exception and not at.error
    z = chart(at, "readouts.patch_map")["data"][0]["z"]
    model = catalogue.load_model("smollm2")
    pair = patching.prepare(model, patching.SAMPLE_CLEAN, patching.SAMPLE_CORRUPTED, " Mary", " John")
    want = patching_paths.path_map(model, pair, 2, 1, "k", senders={1: [4]})
    assert abs(z[1][4] - float(want.recovered[1, 4])) < 1e-4
    assert z[2] == [None] * 9 and all(v is not None for v in z[0])
    assert any("Path patching" in c.value for c in at.caption)


def test_head_output_patching_sits_next_to_attribution():
    at = readouts("smollm2")
    at.radio(key="readouts.patch_kind").set_value("z").run()
    at.button(key="readouts.patch_run").click().run()
    assert not at.exception and not at.error
    assert len(at.dataframe) == 1
    table = at.dataframe[0].value
    assert list(table["patching head"])[:1] == ["L23H3"] and len(table) == 5
    assert table["direct contribution"].is_monotonic_decreasing


def test_translate_page_patching_section():
    at = AppTest.from_file(TRANSLATE, default_timeout=300).run()
    assert not at.exception
    at.radio(key="translate.patch_kind").set_value("cross").run()
    at.button(key="translate.patch_run").click().run()
    assert not at.exception and not at.error
    z = chart(at, "translate.patch_map")["data"][0]["z"]
    model = catalogue.load_model("en-pt")
    pair = patching_translate.prepare(model, patching_translate.SAMPLE_CLEAN, patching_translate.SAMPLE_CORRUPTED)
    want = patching_translate.patch_map(model, pair, "cross")
    assert np.allclose(np.array(z, dtype=float), want.recovered.numpy(), atol=1e-4, rtol=0)
    at.text_input(key="translate.patch_corrupted").input("The cat sleeps on the sofa.").run()
    at.button(key="translate.patch_run").click().run()
    assert not at.exception and "same length" in at.error[0].value
