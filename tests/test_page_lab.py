"""Lab page (AppTest): the recomputation is verified on MiniLM, toggles recompute, positional and
permutation sections render real numbers, toys load and train, bad input gets clear messages."""
import contextlib
import json
import re
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "5_Lab.py")
PICKER = "model_choice:encoder/lm"


def app() -> AppTest:
    return AppTest.from_file(PAGE, default_timeout=300).run()


def texts(elements) -> str:
    return " | ".join(e.value for e in elements)


def shown(elements) -> str:
    """The text a reader sees: user-supplied names are markdown-escaped (ui.plain) on the page."""
    return re.sub(r"\\(.)", r"\1", texts(elements))


def frame_with(at, column):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def test_step_by_step_on_minilm_and_sections_render():
    at = app()
    assert not at.exception
    assert "equals the pattern the model captured" in texts(at.success)
    steps = frame_with(at, "shape")
    assert "A = softmax(masked)" in set(steps["step"])
    shape_of = dict(zip(steps["step"], steps["shape"]))
    n = int(shape_of["x: input of block 0"].split(" × ")[0])
    assert n > 5 and shape_of["x: input of block 0"] == f"{n} × 384"
    assert shape_of["W_Q of head 0"] == "384 × 32" and shape_of["A = softmax(masked)"] == f"{n} × {n}"
    assert len(at.get("plotly_chart")) > 20
    # positional and permutation sections: exact equivariance without positions
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["Without positions: max |difference|"]) < 1e-12
    assert float(metrics["With learned positions: max |difference|"]) > 0.05
    # toy tab: the first shipped checkpoint with its measured accuracy
    assert float(metrics["Exact accuracy (2,000 held-out prompts)"].rstrip("%")) >= 95


def test_temperature_and_masks_recompute_live():
    at = app()
    at.slider(key="lab_temp").set_value(3.0).run()
    assert not at.exception
    assert "differs from the one the model captured by design" in texts(at.info)
    at.slider(key="lab_temp").set_value(1.0).run()
    at.toggle(key="lab_causal_False").set_value(True).run()
    assert not at.exception and "by design" in texts(at.info)
    masks = frame_with(at, "shape")
    assert "causal" in masks.loc[masks["step"] == "mask (1 = may attend)", "note"].item()


def test_model_change_head_out_of_range_and_one_token():
    at = app()
    at.number_input(key="lab_head").set_value(11).run()
    assert not at.exception
    at.selectbox(key=PICKER).select("toy-copy").run()     # 4 heads: head 11 no longer exists
    assert not at.exception
    assert "head 11 is out of range for toy-copy" in shown(at.warning)
    assert at.session_state["lab_head"] == 3
    at.text_input(key="lab_text").input("31415926").run()
    assert not at.exception and "equals the pattern" in texts(at.success)
    at.text_input(key="lab_text").input("BOS").run()       # one token
    assert not at.exception and "at least two tokens" in texts(at.error)


def test_toy_training_budget_and_live_training():
    at = app()
    at.radio(key="lab_toy_source").set_value("train one now").run()
    # form widgets: set them all, then submit (a rerun in between would drop the pending values)
    at.number_input(key="lab_toy_steps").set_value(5000)
    at.select_slider(key="lab_toy_width").set_value(128)
    at.slider(key="lab_toy_layers").set_value(4)
    at.button(key="lab_toy_train").click().run()
    assert not at.exception
    assert "over the 60 s budget on two cores: use at most" in shown(at.error)
    assert "lab_toy_trained" not in at.session_state
    at.number_input(key="lab_toy_steps").set_value(60)
    at.select_slider(key="lab_toy_width").set_value(32)
    at.slider(key="lab_toy_layers").set_value(1)
    at.slider(key="lab_toy_len").set_value(3)
    at.button(key="lab_toy_train").click().run()
    assert not at.exception
    assert "Trained 60 steps" in texts(at.success) + texts(at.warning)
    assert "Peak training memory" in " ".join(c.value for c in at.caption)
    metrics = {m.label: m.value for m in at.metric}
    assert "Exact accuracy (2,000 held-out prompts)" in metrics  # the trained toy is evaluated


def test_four_vs_eight_heads_and_variants():
    at = app()
    at.button(key="lab_toy_cmp").click().run()
    assert not at.exception
    table = frame_with(at, "ms (1 prompt)")
    assert sorted(table["heads"]) == [4, 8] and (table["exact accuracy"] > 0.9).all()
    at.button(key="lab_toy_mem").click().run()
    at.button(key="lab_toy_prune").click().run()
    assert not at.exception
    assert "ms (1 prompt)" in " ".join(" ".join(d.value.columns) for d in at.dataframe)  # still shown
    titles = " ".join(json.loads(c.proto.spec).get("layout", {}).get("title", {}).get("text", "")
                      for c in at.get("plotly_chart"))
    assert "Peak memory of one training step" in titles
    curve = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                 if "heads switched off" in json.dumps(json.loads(c.proto.spec).get("layout", {})))
    assert len(curve["data"][0]["x"]) == 2 * 4 + 1  # toy-copy: 2 layers x 4 heads, plus none off
    at.multiselect(key="lab_var_specs").set_value(["local:4", "temp:2"])
    at.multiselect(key="lab_var_layers_minilm").set_value([0, 1])
    at.button(key="lab_var_go").click().run()
    assert not at.exception
    fid = frame_with(at, "sentence cosine")
    assert list(fid["variant"]) == ["local:4", "temp:2"]
    assert np.all((fid["sentence cosine"] > 0) & (fid["sentence cosine"] < 1))


def test_toy_training_holds_a_heavy_job_slot_and_says_when_the_server_is_busy():
    """Issue 11.5: a toy training is a heavy job; with every server-wide slot taken (by other
    sessions' runs) it is refused at once with a message, and nothing is trained."""
    from attnviz.base import jobs
    from attnviz.base.limits import LIMITS
    at = app()
    at.radio(key="lab_toy_source").set_value("train one now").run()
    at.number_input(key="lab_toy_steps").set_value(50)
    at.select_slider(key="lab_toy_width").set_value(32)
    at.slider(key="lab_toy_layers").set_value(1)
    with contextlib.ExitStack() as others:
        for i in range(LIMITS.max_heavy_jobs):
            others.enter_context(jobs.heavy_job(f"another session's sweep {i}"))
        at.button(key="lab_toy_train").click().run()
    assert not at.exception
    assert "already running" in texts(at.error)
    assert "lab_toy_trained" not in at.session_state
    # the slot is taken while it trains and given back after
    held = []
    real = jobs.heavy_job

    @contextlib.contextmanager
    def spy(name, limit=None):
        with real(name, limit):
            held.append(list(jobs.running_jobs()))
            yield
    jobs.heavy_job = spy
    try:
        at.button(key="lab_toy_train").click().run()
    finally:
        jobs.heavy_job = real
    assert not at.exception and "lab_toy_trained" in at.session_state
    assert held and "a toy training" in held[0] and jobs.running_jobs() == []
