"""The Lab's toy translator (SVO -> SOV with particles): the shipped checkpoint translates the
held-out sentences, and its stated alignment hit rates are what its cross-attention gives."""
import math
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attnviz.toys import toy_translator

LAB = str(Path(__file__).resolve().parent.parent / "pages" / "5_Lab.py")


@pytest.fixture(scope="module")
def shipped():
    return toy_translator.load()


def test_the_language_pair_and_its_known_alignment():
    pairs = toy_translator.sentences()
    assert len(pairs) == 8 * 6 * 6 * 8 and pairs[0] == ("cat sees red fish", "cat ga red fish wo sees")
    train, held_out = toy_translator.split()
    assert not set(train) & set(held_out) and len(held_out) == len(pairs) - len(train)
    for source, target in pairs[:50]:
        s, t = source.split(), target.split()
        assert all(t[i] == s[j] for i, j in toy_translator.ALIGNED.items())


def test_the_shipped_model_translates_held_out_sentences_and_its_stated_hits_hold(shipped):
    model, meta = shipped
    _, held_out = toy_translator.split(meta["seed"])
    assert model.translate("cat sees red fish").text == "cat ga red fish wo sees"
    again = toy_translator.alignment_hits(model, held_out)
    assert again["exact"] == meta["alignment"]["exact"] == 1.0
    assert again["layers"] == pytest.approx(meta["alignment"]["layers"], abs=1e-6)
    for ours, stated in zip(again["heads"], meta["alignment"]["heads"]):
        assert ours == pytest.approx(stated, abs=1e-6)
    assert max(again["layers"]) > 0.5   # far above chance (1 in 5 source positions)


def test_training_runs_and_learns():
    net, meta = toy_translator.train(steps=60)
    assert meta["final_loss"] < 2 / 3 * math.log(len(toy_translator.WORDS))   # a third below chance (ln 35 = 3.6)


def test_the_lab_view():
    at = AppTest.from_file(LAB, default_timeout=180)
    at.session_state["lab.view"] = "Toy translator"
    at.run()
    assert not at.exception, at.exception
    assert any(m.value.startswith("**chases") or "ga" in m.value for m in at.markdown)
    at.selectbox(key="lab.toy_translate_v").set_value("finds").run()
    assert not at.exception, at.exception
    assert any(m.value == "**cat ga red ball wo finds**" for m in at.markdown)
    assert at.dataframe and at.get("plotly_chart")
