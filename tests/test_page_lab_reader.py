"""The Lab's image reader (AppTest): it says it was trained here, trains on a small budget with a
heavy-job slot, reads a typed string, draws each token's cross-attention on the picture, and a head
switched off in the shared head editor reaches the reading; bad input gets a clear message."""
import re
from pathlib import Path

import torch
from streamlit.testing.v1 import AppTest

from attnviz.base import jobs
from attnviz.toys import image_reader, reader_training

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "5_Lab.py")


def trained_view(steps: int = 30) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=300).run()
    at.radio(key="lab.view").set_value("Text reads an image").run()
    assert not at.exception, at.exception
    assert any("Trained here in the Lab, not a pretrained model" in m.value for m in at.markdown)
    at.number_input(key="lab.reader_steps").set_value(steps)
    at.button(key="lab.reader_train").click().run()
    assert not at.exception, at.exception
    return at


def test_train_read_and_switch_a_head_off():
    at = trained_view()
    assert any("Trained here in the Lab: 30 steps" in s.value for s in at.success), [s.value for s in at.success]
    assert jobs.running_jobs() == []                        # the slot was given back
    metrics = {m.label: m.value for m in at.metric}
    assert re.fullmatch(r"\d+\.\d%", metrics["Held-out pictures read exactly"])
    at.text_input(key="lab.reader_text_90417").input("385").run()
    assert not at.exception, at.exception
    res, reader_key = at.session_state["lab.reader_trained"]
    plain = image_reader.read(res.net, "385")
    assert any(f"The reader reads **{plain.text or '(nothing)'}**" in m.value for m in at.markdown)
    assert len(at.get("image")) == 2                       # the token's overlays, and every token's
    row = f"lab_reader.row:{reader_key}:2x4:1"
    assert list(at.session_state[row]) == [0, 1, 2, 3]
    at.session_state[row] = [1, 2, 3]                       # head 0 of layer 1 off, then Apply
    at.run()
    at.button(key="lab_reader.apply").click().run()
    assert not at.exception, at.exception
    keep = torch.ones(2, 4)
    keep[1, 0] = 0
    masked = image_reader.read(res.net, "385", head_mask=keep)
    table = at.dataframe[0].value
    assert [round(p, 3) for p in masked.logprobs] == list(table["log p"])
    assert list(table["token"]) == masked.tokens


def test_bad_string_gets_a_message_and_the_training_is_kept():
    at = trained_view(20)
    at.text_input(key="lab.reader_text_90417").input("12x").run()
    assert not at.exception
    assert any("the reader reads 1 to 5 digits" in e.value for e in at.error)
    assert "lab.reader_trained" in at.session_state


def test_the_images_page_opens_the_lab_on_the_reader():
    at = AppTest.from_file(str(Path(PAGE).with_name("3_Images.py")), default_timeout=300).run()
    at.button(key="images.to_reader").click().run()
    assert not at.exception, at.exception
    assert at.session_state["lab.view"] == "Text reads an image"


def test_the_view_opens_on_the_reader_trained_here_earlier():
    at = AppTest.from_file(PAGE, default_timeout=300).run()
    at.radio(key="lab.view").set_value("Text reads an image").run()
    assert not at.exception, at.exception
    shipped = reader_training.load()
    assert any("Trained here in the Lab earlier, not a pretrained model" in i.value for i in at.info)
    assert {m.label: m.value for m in at.metric}["Held-out pictures read exactly"] == f"{shipped.exact:.1%}"
    assert any("The reader reads **90417**: read exactly." in m.value for m in at.markdown)
    assert any(m.value.startswith("Token '9' puts") for m in at.markdown)
    assert len(at.get("image")) == 2
