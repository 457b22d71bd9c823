"""The app's pages open and run on a tiny model of every decoder and encoder family (AppTest): each
laid out in a Hugging Face cache, picked by name in the sidebar, then the pages of its kind (a
decoder's Attention, Heads, Lab and Readouts; an encoder's first three) run on it without an error."""
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from attnviz.weights.families import FAMILIES
from tests import hub_cache
from tests.test_parity import DECODERS, ENCODERS

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PICK = "model_choice:encoder/lm/vision"
PAGES = ["pages/1_Attention.py", "pages/2_Heads.py", "pages/5_Lab.py", "pages/8_Readouts.py"]
# one row per family: the family's own name, or its first variant
ROWS = [next(r for r in ["llama", *DECODERS] if r == name or r.startswith(name + "_"))
        for name, f in FAMILIES.items() if f.TASK == "lm" and name != "gpt2"]
ENCODER_ROWS = [next(r for r in ENCODERS if r == name or r.startswith(name + "_"))
                for name, f in FAMILIES.items() if f.TASK == "encoder" and name != "bert"]
ENCODER_PAGES = PAGES[:3]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with hub_cache.offline_cache(tmp_path_factory.mktemp("hf") / "hub") as root:
        for row in ROWS + ENCODER_ROWS:
            folder = tmp_path_factory.mktemp(row)
            hub_cache.model_folder(folder, row)
            hub_cache.lay_out(root, f"org/{row}", folder)
        yield root


@pytest.mark.parametrize("row,pages", [(r, PAGES) for r in ROWS] + [(r, ENCODER_PAGES) for r in ENCODER_ROWS])
def test_pages_run_on_every_family(row, pages, cache):
    st.cache_resource.clear()
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state[PICK] = f"org/{row}"
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert f"Loaded: org/{row}" in [h.value.replace("\\", "") for h in at.subheader]
    for page in pages:
        at.switch_page(page).run()
        assert not at.exception, (page, at.exception)
        assert not at.error, (page, [e.value for e in at.error])
        assert at.get("plotly_chart") or at.get("imgs"), page     # each page drew its figures


@pytest.mark.parametrize("row,terms", [("mpnet", set()), ("deberta-v2", {"content → position", "position → content"})])
def test_the_lab_shows_an_encoders_position_terms_apart(row, terms, cache):
    """The attention map is the one the model uses; the Lab's step-by-step head shows what the
    relative positions add to its scores (DeBERTa: each disentangled term) as steps of their own."""
    st.cache_resource.clear()
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state[PICK] = f"org/{row}"
    at.run()
    at.switch_page("pages/5_Lab.py").run()
    at.radio(key="lab.steps_mode").set_value("All steps").run()
    assert not at.exception, at.exception
    steps = next(d.value for d in at.dataframe if "shape" in d.value.columns)
    assert {"position bias", *terms} <= set(steps["step"])
    assert "equals the pattern the model captured" in " ".join(s.value for s in at.success)
