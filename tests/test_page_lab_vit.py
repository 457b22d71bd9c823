"""The Lab's toy ViT (AppTest): it says it was trained here and that masking keeps the n² compute,
trains the chosen configurations under a heavy-job slot, shows the table, the figures and the
sentence read from the counts (the same counts as the library's), keeps them across reruns, and
says what went wrong when nothing is chosen or the time limit is reached."""
from pathlib import Path

from streamlit.testing.v1 import AppTest

from attnviz.base import jobs
from attnviz.toys import toy_vit
from attnviz.ui import lab_vit

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "5_Lab.py")
CHOSEN = ["learned, full", "sinusoidal 2-D, axial"]


def vit_view() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=300).run()
    at.radio(key="lab.view").set_value(lab_vit.VIEW).run()
    assert not at.exception, at.exception
    assert any("Trained here in the Lab, not a pretrained model" in m.value for m in at.markdown)
    assert any("its wall time here is not lower" in i.value for i in at.info)
    at.number_input(key="lab.vit_steps").set_value(10)
    at.multiselect(key="lab.vit_configs").set_value(CHOSEN)
    return at


def test_train_two_configurations_and_read_the_table_figures_and_sentence():
    at = vit_view()
    at.button(key="lab.vit_train").click().run()
    assert not at.exception, at.exception
    assert jobs.running_jobs() == []                                   # the slot was given back
    table = at.dataframe[0].value
    assert list(table["configuration"]) == CHOSEN
    expected = [toy_vit.train(toy_vit.VitSettings(positions=p, attention=a, steps=10))
                for p, a in (lab_vit.LABELS[c] for c in CHOSEN)]
    assert list(table["correct"]) == [r.correct for r in expected]
    assert list(table["held out"]) == [400, 400] and list(table["steps"]) == [10, 10]
    assert list(table["attention FLOPs (real axial)"]) == [1_048_576, 131_072]
    assert list(table["attention FLOPs computed here"]) == [1_048_576, 1_048_576]
    assert len(at.get("plotly_chart")) == 3                            # accuracy, FLOPs, attention maps
    assert any(m.value == toy_vit.summary(expected) for m in at.markdown)
    at.radio(key="lab.vit_mark").set_value("second mark").run()         # a rerun keeps the results
    assert not at.exception, at.exception
    assert list(at.dataframe[0].value["correct"]) == [r.correct for r in expected]


def test_nothing_chosen_gets_a_message():
    at = vit_view()
    at.multiselect(key="lab.vit_configs").set_value([])
    at.button(key="lab.vit_train").click().run()
    assert not at.exception, at.exception
    assert any("Choose at least one configuration" in w.value for w in at.warning)
    assert not at.dataframe


def test_the_time_limit_stops_between_blocks_with_a_message(set_limits):
    at = vit_view()
    set_limits(max_lab_seconds=0)                                       # expired before the first block
    at.button(key="lab.vit_train").click().run()
    assert not at.exception, at.exception
    assert any("the toy ViT training stopped at its time limit of 0 s, after 0 of 2 configurations" in e.value
               for e in at.error), [e.value for e in at.error]
    assert jobs.running_jobs() == []
