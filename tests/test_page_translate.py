"""AppTest of pages/6_Translate.py with the bundled en-pt / pt-en students: the default sentence,
every view (only the chosen one is drawn), heads switched off, and bad input (empty, spaces,
unknown pieces, a long paste)."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attnviz.ui import kept_inputs

PAGE = str(Path(__file__).resolve().parent.parent / "pages" / "6_Translate.py")


def run_page(text: str | None = None, direction: str | None = None) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=180)
    if direction:
        at.session_state["translate.direction"] = direction
    at.run()
    assert not at.exception, at.exception
    if text is not None:
        at.text_area(key="translate.text").input(text)
        at.button(key="translate.go").click().run()
        assert not at.exception, at.exception
    return at


VIEWS = ["Cross-attention", "Alignment", "Step through decoding", "Encoder self-attention", "Switch heads off"]


def charts(at) -> set[str]:
    return {c.proto.id for c in at.get("plotly_chart")}


def view(at, name: str) -> AppTest:
    """Choose one of the page's views: only the chosen view is drawn and computed."""
    at.radio(key="translate.view").set_value(name).run()
    assert not at.exception, at.exception
    return at


def charts_of_every_view(at) -> int:
    return sum(len(view(at, name).get("plotly_chart")) for name in VIEWS)


def test_default_sentence_is_translated_with_every_view():
    at = run_page()
    assert at.subheader[0].value == "Eu te amo."
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["log-probability"]) < 0 and metrics["tokens"] == "5 → 6"
    assert at.radio(key="translate.view").value == "Cross-attention"
    assert len(at.get("plotly_chart")) == 2   # only the chosen view: its heatmap and grid
    assert charts_of_every_view(at) >= 8   # heatmap, grid, alignment, step row, top-10, encoder x3
    assert any("SSRU" in m.value for m in at.markdown)
    view(at, "Step through decoding").slider(key="translate.step").set_value(3).run()
    assert not at.exception
    assert any("now choosing **mo**" in m.value for m in at.markdown)


def test_switching_cross_attention_heads_off_changes_the_translation():
    at = view(run_page(), "Switch heads off")
    assert any("Every head is on" in i.value for i in at.info)
    at.checkbox(key="translate.layer:en-pt:2x8:1").uncheck().run()  # the shared editor's layer box
    assert any("Every head is on" in i.value for i in at.info)       # it waits for Apply
    at.button(key="translate.apply").click().run()
    assert not at.exception, at.exception
    assert any(m.value.startswith("Change: ~~") for m in at.markdown)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["first differing step"] != "none"
    assert float(metrics["original translation's log-probability"]) < -0.147


def test_other_direction():
    at = run_page("O gato está dormindo.", direction="pt-en")
    assert at.subheader[0].value == "The cat is sleeping."


@pytest.mark.parametrize("text", ["", "    "])
def test_empty_text_gets_a_message(text):
    at = run_page(text)
    assert any("empty" in e.value for e in at.error)
    assert not at.get("plotly_chart")


def test_emoji_and_cjk_show_unknown_pieces():
    at = run_page("I love 😀 you 我爱你.")
    assert at.subheader[0].value == "Eu amo você."
    assert any("outside the vocabulary" in i.value and "😀" in i.value for i in at.info)


def test_a_long_paste_is_cut_with_a_message(set_limits):
    set_limits(max_source_tokens=24)
    # the box takes at most LINK_CHARS characters (it lives in the link): the longest paste it takes
    at = run_page(" ".join(["The children are playing football in the park."] * 250)[:kept_inputs.LINK_CHARS])
    assert any("was cut" in w.value for w in at.warning)
    assert at.subheader[0].value


def test_portuguese_into_en_pt_still_translates():
    at = run_page("Eu te amo muito.")
    assert at.subheader[0].value
    assert not at.error


def test_single_heads_wait_for_apply():
    at = view(run_page(), "Switch heads off")
    at.pills(key="translate.row:en-pt:2x8:1").set_value([1, 2, 3, 4, 5, 6, 7]).run()
    assert not at.exception, at.exception
    assert not any(m.value.startswith("Change:") or "did not change" in m.value for m in at.markdown)
    at.button(key="translate.apply").click().run()
    assert not at.exception, at.exception
    assert at.radio(key="translate.view").value == "Switch heads off"   # the choice survives the button
    # one head of the last layer off: the same words, a lower log-probability, no differing step
    assert any(m.value == "The translation did not change." for m in at.markdown)
    metrics = [(m.label, m.value) for m in at.metric]
    assert ("first differing step", "none") in metrics
    assert float(dict(metrics)["original translation's log-probability"]) < -0.147


def test_an_allowed_local_bart_folder_runs_on_the_page(tmp_path, set_limits):
    from tests.test_seq2seq_hf import tiny, word_tokenizer
    hf = tiny("bart", seed=3)
    hf.save_pretrained(tmp_path / "tiny-bart")
    word_tokenizer(hf).save_pretrained(tmp_path / "tiny-bart")
    (tmp_path / "tiny-bert").mkdir()
    set_limits(allowed_model_dirs=str(tmp_path))
    at = AppTest.from_file(PAGE, default_timeout=180)
    at.session_state["translate.direction"] = "local folder…"
    at.run()
    assert not at.exception, at.exception
    assert any("Type the folder" in i.value for i in at.info)
    at.text_input(key="translate.folder").input(str(tmp_path / "tiny-bart")).run()
    at.text_area(key="translate.text").input("w5 w9 w17")
    at.button(key="translate.go").click().run()
    assert not at.exception, at.exception
    assert at.subheader and charts_of_every_view(at) >= 8   # self-attention decoder: same views
    at.text_input(key="translate.folder").input(str(tmp_path / "elsewhere")).run()
    assert not at.exception and at.error
