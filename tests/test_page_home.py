"""A newcomer's first visit: the Home cards are links, the models table says which model reads Chinese,
a first load says how long it takes, and Readouts leaves the view an encoder forced."""
from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from attnviz.ui import first_load

ROOT = Path(__file__).resolve().parents[1]


def test_home_cards_link_to_their_pages_and_the_table_says_who_reads_chinese():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    assert not at.exception
    cards = [(e.proto.page, e.proto.label) for e in at.get("page_link") if e.proto.label.startswith("**")]
    pages = sorted(p.stem for p in (ROOT / "pages").glob("*.py"))           # "2_Heads"
    assert cards == [(p.split("_", 1)[1], f"**{p.replace('_', '. ', 1)}**") for p in pages]   # one link a card
    table = next(d.value for d in at.dataframe if "chinese" in d.value.columns).set_index("model")
    assert table.loc["e5-small", "chinese"].startswith("reads it") and table.loc["gemma3-270m", "chinese"].startswith("reads it")
    assert table.loc["smollm2", "chinese"] == "cut into byte pieces"
    assert table.loc["minilm", "chinese"] == "no: [UNK]" and table.loc["dinov2", "chinese"] == ""


def test_a_first_load_says_how_long_it_takes(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path))            # nothing converted yet
    said = first_load.expected("smollm2")
    assert said.startswith("The first load on this server takes about 50 s") and "93 MB" in said
    (tmp_path / "smollm2-0123456789abcdef").mkdir()
    (tmp_path / "smollm2-0123456789abcdef" / "config.json").write_text("{}")
    assert first_load.expected("smollm2").startswith("This takes about 10 s")
    assert first_load.expected("toy-recall") is None


def test_readouts_leaves_patching_for_a_view_the_new_model_has():
    at = AppTest.from_file(str(ROOT / "pages" / "8_Readouts.py"), default_timeout=300)
    at.session_state["model_choice:encoder/lm"] = "minilm"
    at.run()
    assert not at.exception and at.radio(key="readouts.view").value == "Patching"
    at.selectbox(key="model_choice:encoder/lm").set_value("smollm2").run()
    assert not at.exception and at.radio(key="readouts.view").value == "Logit lens"
    at.radio(key="readouts.view").set_value("Patching").run()       # chosen for a language model: kept
    at.selectbox(key="model_choice:encoder/lm").set_value("gemma3-270m").run()
    assert at.radio(key="readouts.view").value == "Patching"
