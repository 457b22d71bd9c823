"""AppTest: the Translate page opens and translates on a tiny model of every encoder-decoder
family (Marian, BART, mBART, M2M100, T5, T5 v1.1, mT5), each laid out in a Hugging Face cache with
its own tokenizer files and picked by name, with every view the bundled en-pt model has; a
multilingual model translates into the language picked in the sidebar."""
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from tests import hub_cache
from tests.test_page_translate import PAGE, charts_of_every_view, view
from tests.test_parity import LANGUAGES, S2S_REPOS, SEQ2SEQ, seq2seq_tokenizer, tiny_seq2seq


def repo(row: str) -> str:
    return S2S_REPOS.get(row, f"org/tiny-{row.replace('_', '-')}")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with hub_cache.offline_cache(tmp_path_factory.mktemp("hf") / "hub") as root:
        for row in SEQ2SEQ:
            folder = tmp_path_factory.mktemp(row)
            hf = tiny_seq2seq(row, seed=3)
            hf.save_pretrained(folder)
            seq2seq_tokenizer(hf, LANGUAGES.get(row, ())).save_pretrained(folder)
            hub_cache.lay_out(root, repo(row), folder)
        yield root


@pytest.mark.parametrize("row", list(SEQ2SEQ))
def test_the_translate_page_runs_every_view_on_every_family(row, cache):
    st.cache_resource.clear()
    at = AppTest.from_file(PAGE, default_timeout=300)
    at.session_state["translate.direction"] = repo(row)
    at.run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    if row in LANGUAGES:   # the target language is picked in the sidebar
        assert at.selectbox(key="translate.into").options == list(LANGUAGES[row])
        at.selectbox(key="translate.into").set_value("w61")
    at.text_area(key="translate.text").input("w5 w9 w17 w22")
    at.button(key="translate.go").click().run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert at.subheader
    if row in LANGUAGES:
        assert any(c.value.startswith("Translating into w61") for c in at.caption)
    assert charts_of_every_view(at) >= 8   # the same views as the bundled en-pt model
    # T5's relative positions: the encoder view shows the head's bias beside its map
    relative = SEQ2SEQ[row][0].endswith("T5ForConditionalGeneration")
    assert len(view(at, "Encoder self-attention").get("plotly_chart")) == 3 + relative
