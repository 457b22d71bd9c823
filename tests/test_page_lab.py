"""Lab page (AppTest): the recomputation is verified on MiniLM, toggles recompute, positional and
permutation sections render real numbers, toys load and train, bad input gets clear messages."""
import contextlib
import json
import re
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

from attnviz.ui import shared_view

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "5_Lab.py")
PICKER = "model_choice:encoder/lm"
SENTENCE = "The animal didn't cross the street because it was too tired."


def app() -> AppTest:
    return AppTest.from_file(PAGE, default_timeout=300).run()


def view(at, name: str) -> AppTest:
    """Choose one of the Lab's views: only the chosen view is drawn and computed."""
    at.radio(key="lab.view").set_value(name).run()
    assert not at.exception, at.exception
    return at


def texts(elements) -> str:
    return " | ".join(e.value for e in elements)


def shown(elements) -> str:
    """The text a reader sees: user-supplied names are markdown-escaped (ui.plain) on the page."""
    return re.sub(r"\\(.)", r"\1", texts(elements))


def frame_with(at, column):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def all_steps(at) -> AppTest:
    """Step by step's full view: the table and every stage's heatmap (guided is the default)."""
    at.radio(key="lab.steps_mode").set_value("All steps").run()
    assert not at.exception, at.exception
    return at


def head(at, layer: int, head: int) -> AppTest:
    """Step by step on a fixed head (a first open shows the head where 'it' looks most at 'animal')."""
    at.number_input(key="lab.layer").set_value(layer)
    at.number_input(key="lab.head").set_value(head).run()
    assert not at.exception, at.exception
    return at


def test_step_by_step_on_minilm_and_sections_render():
    at = all_steps(head(app(), 0, 0))
    assert not at.exception
    assert "equals the pattern the model captured" in texts(at.success)
    guided_steps = frame_with(at, "shape")
    assert "A = softmax(masked)" in set(guided_steps["step"])
    shape_of = dict(zip(guided_steps["step"], guided_steps["shape"]))
    n = int(shape_of["x: input of block 0"].split(" × ")[0])
    assert n > 5 and shape_of["x: input of block 0"] == f"{n} × 384"
    assert shape_of["W_Q of head 0"] == "384 × 32" and shape_of["A = softmax(masked)"] == f"{n} × {n}"
    step_charts = len(at.get("plotly_chart"))
    assert step_charts == len(guided_steps)                     # one figure per step of the table
    # positional and permutation sections: exact equivariance without positions, on a button
    view(at, "Positional encodings")
    assert len(at.get("plotly_chart")) == 9               # sinusoidal, learned, rotary, ALiBi, curves
    assert step_charts + len(at.get("plotly_chart")) > 20
    at.button(key="lab.perm_go").click().run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["Without positions: max |difference|"]) < 1e-12
    assert float(metrics["With learned positions: max |difference|"]) > 0.05
    # toy view: the first shipped checkpoint with its measured accuracy
    view(at, "Toy transformers")
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["Exact accuracy (2,000 held-out prompts)"].rstrip("%")) >= 95


def test_temperature_and_masks_recompute_live():
    at = app()
    at.slider(key="lab.temp").set_value(3.0).run()
    assert not at.exception
    assert "differs from the one the model captured by design" in texts(at.info)
    at.slider(key="lab.temp").set_value(1.0).run()
    at.toggle(key="lab.causal_False").set_value(True).run()
    assert not at.exception and "by design" in texts(at.info)
    masks = frame_with(all_steps(at), "shape")
    assert "causal" in masks.loc[masks["step"] == "mask (1 = may attend)", "note"].item()


def strongest(model_key: str, text: str = SENTENCE) -> tuple[int, int, float]:
    """(layer, head, weight) where the model's own trace sends "it" most to "animal"."""
    from attnviz.ui import common
    tr = common.shared_model(model_key).trace(text)
    it = [t.lstrip(" ") for t in tr.tokens].index("it")
    w = tr.attentions[:, :, it, [t.lstrip(" ") for t in tr.tokens].index("animal")]   # (L, H)
    layer, h = divmod(int(w.argmax()), w.shape[1])
    return layer, h, float(w.max())


def opened_caption(at) -> list[str]:
    return [c.value for c in at.caption if c.value.startswith("Opened on")]


def test_step_by_step_opens_on_the_head_where_it_looks_most_at_animal(monkeypatch):
    """A first open shows the head with the largest it -> animal weight (MiniLM, then a first open
    of SmolLM2 in a fresh session), says so in one line, costs one trace per model for every
    session, and never moves a head the user chose; a toy or a text without the pair opens L0H0."""
    from attnviz.analysis import guided_steps
    from attnviz.base.names import head_name
    layer, h, w = strongest("minilm")
    assert (layer, h) != (0, 0) and w > 0.3
    at = app()
    assert not at.exception
    assert (at.number_input(key="lab.layer").value, at.number_input(key="lab.head").value) == (layer, h)
    assert opened_caption(at) == [f"Opened on {head_name(layer, h)}, the head where ‘it’ looks most at "
                                  f"‘animal’ ({w:.2f}); choose any other above."]
    assert f"**{head_name(layer, h)}: layer {layer}, head {h}**" in texts(at.markdown)
    assert "equals the pattern the model captured" in texts(at.success)
    calls = []
    real = guided_steps.opening_head
    monkeypatch.setattr(guided_steps, "opening_head", lambda *a: calls.append(a) or real(*a))
    at.run()
    again = app()                                           # another session: from the shared cache
    assert not again.exception and calls == []
    assert again.number_input(key="lab.head").value == h

    chosen = (1, 2) if (layer, h) != (1, 2) else (1, 3)     # a head toy-copy has too (no clamp)
    head(at, *chosen)                                        # the user's choice stays
    at.run()
    at.text_input(key="lab.text").input("Another sentence entirely, with no pronoun.").run()
    view(at, "Positional encodings")
    view(at, "Step by step")
    at.selectbox(key=PICKER).select("toy-copy").run()
    at.selectbox(key=PICKER).select("minilm").run()
    assert not at.exception and calls == []
    assert (at.session_state["lab.layer"], at.session_state["lab.head"]) == chosen
    assert f"**{head_name(*chosen)}: layer {chosen[0]}, head {chosen[1]}**" in texts(at.markdown)
    assert opened_caption(at) == []

    at = app()                                              # a fresh session's first SmolLM2
    at.selectbox(key=PICKER).select("smollm2").run()
    assert not at.exception
    layer, h, w = strongest("smollm2")
    assert (at.number_input(key="lab.layer").value, at.number_input(key="lab.head").value) == (layer, h)
    assert opened_caption(at) == [f"Opened on {head_name(layer, h)}, the head where ‘it’ looks most at "
                                  f"‘animal’ ({w:.2f}); choose any other above."]
    at.selectbox(key=PICKER).select("toy-copy").run()       # not a text of words: L0H0, no line
    assert not at.exception
    assert (at.session_state["lab.layer"], at.session_state["lab.head"]) == (0, 0)
    assert opened_caption(at) == []


def test_guided_steps_show_the_causal_mask_on_the_followed_row():
    """Guided by default; with the causal mask on, the mask step names the later keys
    of the followed token ("it") as −∞ and softmax gives them exactly 0."""
    at = app()
    at.toggle(key="lab.causal_False").set_value(True).run()
    at.radio(key="lab.step").set_value(2).run()
    assert not at.exception
    q = at.selectbox(key="lab.query").value
    n = int(re.search(r"(\d+) tokens", texts(at.markdown)).group(1))
    later = list(range(q + 1, n))
    said = shown([i for i in at.info if i.value.startswith("**Step 3 of 6")])
    assert f"{len(later)} of {n} keys are masked for ‘it’" in said and "become −∞" in said
    bars = json.loads(next(c.proto.spec for c in at.get("plotly_chart") if c.proto.id.endswith("-lab.guide_bars")))
    assert [bars["data"][0]["text"][j] for j in later] == ["−∞"] * len(later)
    at.button(key="lab.next").click().run()
    said = shown([i for i in at.info if i.value.startswith("**Step 4 of 6")])
    assert "the masked keys get exactly 0" in said
    bars = json.loads(next(c.proto.spec for c in at.get("plotly_chart") if c.proto.id.endswith("-lab.guide_bars")))
    assert [bars["data"][0]["text"][j] for j in later] == ["0"] * len(later)


def test_model_change_head_out_of_range_and_one_token():
    at = app()
    at.number_input(key="lab.head").set_value(11).run()
    assert not at.exception
    at.selectbox(key=PICKER).select("toy-copy").run()     # 4 heads: head 11 no longer exists
    assert not at.exception
    assert "head 11 is out of range for toy-copy" in shown(at.warning)
    assert at.session_state["lab.head"] == 3
    at.text_input(key="lab.text").input("31415926").run()
    assert not at.exception and "equals the pattern" in texts(at.success)
    at.text_input(key="lab.text").input("BOS").run()       # one token
    assert not at.exception and "at least two tokens" in texts(at.error)


def test_toy_training_budget_and_live_training():
    at = view(app(), "Toy transformers")
    at.radio(key="lab.toy_source").set_value("train one now").run()
    # form widgets: set them all, then submit (a rerun in between would drop the pending values)
    at.number_input(key="lab.toy_steps").set_value(5000)
    at.select_slider(key="lab.toy_width").set_value(128)
    at.slider(key="lab.toy_layers").set_value(4)
    at.button(key="lab.toy_train").click().run()
    assert not at.exception
    assert "over the 60 s budget on two cores: use at most" in shown(at.error)
    assert "lab.toy_trained" not in at.session_state
    at.number_input(key="lab.toy_steps").set_value(60)
    at.select_slider(key="lab.toy_width").set_value(32)
    at.slider(key="lab.toy_layers").set_value(1)
    at.slider(key="lab.toy_len").set_value(3)
    at.button(key="lab.toy_train").click().run()
    assert not at.exception
    assert "Trained 60 steps" in texts(at.success) + texts(at.warning)
    assert "Peak training memory" in " ".join(c.value for c in at.caption)
    metrics = {m.label: m.value for m in at.metric}
    assert "Exact accuracy (2,000 held-out prompts)" in metrics  # the trained toy is evaluated


def test_four_vs_eight_heads_and_variants():
    at = view(app(), "Toy transformers")
    at.button(key="lab.toy_cmp").click().run()
    assert not at.exception
    table = frame_with(at, "ms (1 prompt)")
    assert sorted(table["heads"]) == [4, 8] and (table["exact accuracy"] > 0.9).all()
    at.button(key="lab.toy_mem").click().run()
    at.button(key="lab.toy_prune").click().run()
    assert not at.exception
    assert "ms (1 prompt)" in " ".join(" ".join(d.value.columns) for d in at.dataframe)  # still shown
    titles = " ".join(json.loads(c.proto.spec).get("layout", {}).get("title", {}).get("text", "")
                      for c in at.get("plotly_chart"))
    assert "Peak memory of one training step" in titles
    curve = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                 if "heads switched off" in json.dumps(json.loads(c.proto.spec).get("layout", {})))
    assert len(curve["data"][0]["x"]) == 2 * 4 + 1  # toy-copy: 2 layers x 4 heads, plus none off
    view(at, "Variants in a pretrained model")
    at.multiselect(key="lab.var_specs").set_value(["local:4", "temp:2"])
    at.multiselect(key="lab.var_layers_minilm").set_value([0, 1])
    at.button(key="lab.var_go").click().run()
    assert not at.exception
    fid = frame_with(at, "sentence cosine")
    assert list(fid["variant"]) == ["local:4", "temp:2"]
    assert np.all((fid["sentence cosine"] > 0) & (fid["sentence cosine"] < 1))


def test_toy_training_holds_a_heavy_job_slot_and_says_when_the_server_is_busy():
    """A toy training is a heavy job; with every server-wide slot taken (by other
    sessions' runs) it is refused at once with a message, and nothing is trained."""
    from attnviz.base import jobs
    from attnviz.base.limits import LIMITS
    at = view(app(), "Toy transformers")
    at.radio(key="lab.toy_source").set_value("train one now").run()
    at.number_input(key="lab.toy_steps").set_value(50)
    at.select_slider(key="lab.toy_width").set_value(32)
    at.slider(key="lab.toy_layers").set_value(1)
    with contextlib.ExitStack() as others:
        for i in range(LIMITS.max_heavy_jobs):
            others.enter_context(jobs.heavy_job(f"another session's sweep {i}"))
        at.button(key="lab.toy_train").click().run()
    assert not at.exception
    assert "already running" in texts(at.error)
    assert "lab.toy_trained" not in at.session_state
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
        at.button(key="lab.toy_train").click().run()
    finally:
        jobs.heavy_job = real
    assert not at.exception and "lab.toy_trained" in at.session_state
    assert held and "a toy training" in held[0] and jobs.running_jobs() == []


def test_permutation_runs_on_its_button_as_a_heavy_job_and_keeps_one_layer(monkeypatch):
    """The permutation test ran on every Lab rerun, with no slot or deadline, and each
    cached entry held four [L, H, n, n] tensors (1 GB for SmolLM2 at 512 tokens). Now it runs on
    its button, holds a heavy-job slot, and what is kept is one layer (and its numbers)."""
    from attnviz.analysis import equivariance
    from attnviz.base import jobs
    from attnviz.base.lru import nbytes
    from attnviz.base.limits import LIMITS
    from attnviz.ui import lab_positions

    calls = []
    real = equivariance.permutation_test
    monkeypatch.setattr(equivariance, "permutation_test", lambda *a, **k: calls.append(k) or real(*a, **k))
    at = view(app(), "Positional encodings")
    at.slider(key="lab.npos").set_value(32).run()                 # a rerun of the view
    assert not at.exception and calls == []
    assert "Press Shuffle and compare" in texts(at.info)
    with contextlib.ExitStack() as others:                        # every slot taken: refused at once
        for i in range(LIMITS.max_heavy_jobs):
            others.enter_context(jobs.heavy_job(f"another session's sweep {i}"))
        at.button(key="lab.perm_go").click().run()
    assert not at.exception and "already running" in texts(at.error) and calls == []
    at.number_input(key="lab.perm_layer").set_value(4)
    at.button(key="lab.perm_go").click().run()
    assert not at.exception and len(calls) == 2 and all(k["layers"] == [4] for k in calls)
    assert jobs.running_jobs() == []
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["Without positions: max |difference|"]) < 1e-12
    wanted = at.session_state["lab.perm_for"]
    kept = lab_positions.results().get(wanted)
    n = len(kept.tokens)
    assert kept.layer == 4 and kept.original.shape == kept.shuffled.shape == (12, n, n)
    assert nbytes(kept) < 2 * 12 * n * n * 4 + 100_000              # one layer of both runs, float32
    at.slider(key="lab.perm_head").set_value(5).run()              # another head: no recomputation
    assert not at.exception and len(calls) == 2
    heat = json.loads(next(c.proto.spec for c in at.get("plotly_chart") if c.proto.id.endswith("-lab.perm_a")))
    z = heat["data"][0]["z"]                                      # plotly's base64 array, or a list
    assert (z["shape"].replace(" ", "") == f"{n},{n}") if isinstance(z, dict) else len(z) == n


def test_variants_measure_holds_a_slot_and_stops_at_its_deadline(set_limits):
    """Measure ran 8 variants x all layers (82 s at 512 tokens on SmolLM2) with no slot
    and no deadline, for any number of sessions at once."""
    from attnviz.base import jobs
    from attnviz.base.limits import LIMITS
    at = view(app(), "Variants in a pretrained model")
    at.multiselect(key="lab.var_specs").set_value(["local:4", "temp:2"])
    at.multiselect(key="lab.var_layers_minilm").set_value([0, 1])
    with contextlib.ExitStack() as others:
        for i in range(LIMITS.max_heavy_jobs):
            others.enter_context(jobs.heavy_job(f"another session's sweep {i}"))
        at.button(key="lab.var_go").click().run()
    assert not at.exception and "already running" in texts(at.error)
    assert not at.session_state["lab.var_rows"]
    set_limits(max_lab_seconds=0.0)
    at.button(key="lab.var_go").click().run()
    assert not at.exception
    assert "stopped at its time limit of 0 s, after 0 of 2 variants" in shown(at.error)
    assert jobs.running_jobs() == []


def test_step_text_is_tokenized_once_per_text(monkeypatch):
    """A live rerun (another layer, head, temperature) does not tokenize the text again."""
    from attnviz.core.model import Model
    seen = []
    real = Model.encode_text
    monkeypatch.setattr(Model, "encode_text", lambda self, text: seen.append(text) or real(self, text))
    at = app()
    text = "A sentence only this test tokenizes, about a heron on one leg."
    at.text_input(key="lab.text").input(text).run()
    assert seen.count(text) == 1
    at.number_input(key="lab.layer").set_value(2).run()
    at.number_input(key="lab.head").set_value(5).run()
    at.slider(key="lab.temp").set_value(2.0).run()
    assert not at.exception and seen.count(text) == 1


def test_toy_heads_off_in_the_shared_head_editor():
    """The Lab's heads-off list of "L1H3" strings is the shared head editor; its
    effect beside the grid is the exact accuracy with the applied heads off."""
    import torch
    from attnviz.toys import tasks
    at = view(app(), "Toy transformers")
    toy_key = at.selectbox(key="lab.toy_key").value
    toy = tasks.load_toy(toy_key)
    L, H = toy.cfg.n_layers, toy.cfg.n_heads
    row = f"toys.row:{toy_key}:{L}x{H}:0"
    assert list(at.session_state[row]) == list(range(H))         # every head on at first
    at.session_state[row] = list(range(1, H))                     # switch head L0H0 off, then Apply
    at.run()
    at.button(key="toys.apply").click().run()
    assert not at.exception
    keep = torch.ones(L, H)
    keep[0, 0] = 0
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Exact accuracy with these heads off"] == f"{tasks.evaluate(toy, keep).exact:.1%}"


def test_permutation_stops_at_the_lab_time_limit(set_limits):
    """The permutation test had no deadline (64-114 s for SmolLM2 at 512 tokens); it
    now checks the Lab's time limit before every block and says what to do."""
    from attnviz.base import jobs
    at = view(app(), "Positional encodings")
    set_limits(max_lab_seconds=0.0)
    at.button(key="lab.perm_go").click().run()
    assert not at.exception
    assert "the permutation test stopped at its time limit of 0 s. Use a shorter sentence" in shown(at.error)
    assert "lab.perm_for" not in at.session_state and jobs.running_jobs() == []


def test_variants_say_not_fine_tuned_and_speed_words_follow_the_measurement():
    """Fidelity numbers read as verdicts, and a caption called local attention faster
    beside a measured 0.66x."""
    at = view(app(), "Variants in a pretrained model")
    at.multiselect(key="lab.var_specs").set_value(["local:4", "temp:2"])
    at.multiselect(key="lab.var_layers_minilm").set_value([0])
    at.button(key="lab.var_go").click().run()
    assert not at.exception
    assert "Not fine-tuned" in texts(at.info)
    table = frame_with(at, "speed-up")
    caption = texts(at.caption)
    for label, ratio in zip(table["variant"], table["speed-up"]):
        word = "faster" if ratio > 1.05 else "slower" if ratio < 0.95 else "about as fast"
        assert f"{label} {ratio:.2f}× ({word})" in caption
    assert "so they are not faster" not in caption


def test_toy_comparison_shows_exact_accuracy_as_a_percentage():
    """A caption's "exact accuracy 1" reads 100 %."""
    at = view(app(), "Toy transformers")
    at.button(key="lab.toy_cmp").click().run()
    assert not at.exception
    table = next(d for d in at.dataframe if "exact accuracy" in d.value.columns)
    assert json.loads(table.proto.columns)["exact accuracy"]["type_config"]["format"] == "percent"


def test_no_progress_bar_is_left_after_toy_training_or_variants_measure():
    """The progress bars of toy training and Variants › Measure stayed on screen."""
    at = view(app(), "Toy transformers")
    at.radio(key="lab.toy_source").set_value("train one now").run()
    at.number_input(key="lab.toy_steps").set_value(50)
    at.select_slider(key="lab.toy_width").set_value(32)
    at.slider(key="lab.toy_layers").set_value(1)
    at.slider(key="lab.toy_len").set_value(3)
    at.button(key="lab.toy_train").click().run()
    assert not at.exception
    assert "Trained 50 steps" in texts(at.success) + texts(at.warning)
    assert len(at.get("progress")) == 0
    view(at, "Variants in a pretrained model")
    at.multiselect(key="lab.var_specs").set_value(["temp:2"])
    at.multiselect(key="lab.var_layers_minilm").set_value([0])
    at.button(key="lab.var_go").click().run()
    assert not at.exception and frame_with(at, "speed-up") is not None
    assert len(at.get("progress")) == 0


def test_first_open_says_what_is_loading_and_how_long_it_took():
    """The first open showed only the sidebar spinner for many seconds."""
    from attnviz.ui import common

    common.forget_loaded()
    at = app()
    assert not at.exception
    status = [e.label for e in at.get("status") if "Loaded minilm in" in e.label]
    assert status and "M parameters" in status[0]
    at.run()                                               # the next run does not say it again
    assert not [e for e in at.get("status") if "Loaded minilm" in e.label]


def test_sub_views_keep_their_inputs_and_the_toy_says_what_it_was_trained_with():
    """Another view and back kept neither the sentence nor the toy form (it showed "copy" under the
    results of a "reverse" toy). Inputs are kept for the session; the results below the form say
    what the toy was trained with, and when the form differs from it."""
    from attnviz.base import jobs
    from attnviz.base.limits import LIMITS
    at = view(app(), "Step by step")
    at.text_input(key="lab.text").input("The cat sat on the mat because it was warm.").run()
    at = view(at, "Toy transformers")
    at.radio(key="lab.toy_source").set_value("train one now").run()
    at.selectbox(key="lab.toy_task").set_value("reverse")
    at.number_input(key="lab.toy_steps").set_value(50)
    at.select_slider(key="lab.toy_width").set_value(32)
    at.slider(key="lab.toy_layers").set_value(1)
    at.slider(key="lab.toy_len").set_value(3)
    at.button(key="lab.toy_train").click().run()
    assert not at.exception and "Trained with: reverse, length 3, 1 layers" in shown(list(at.success) + list(at.warning))
    at = view(view(at, "Step by step"), "Toy transformers")
    assert at.selectbox(key="lab.toy_task").value == "reverse" and at.slider(key="lab.toy_len").value == 3
    assert "The form has changed" not in texts(at.info)
    at.selectbox(key="lab.toy_task").set_value("sort")
    with contextlib.ExitStack() as others:        # every heavy-job slot taken: refused, the toy stays the old one
        for i in range(LIMITS.max_heavy_jobs):
            others.enter_context(jobs.heavy_job(f"another session's sweep {i}"))
        at.button(key="lab.toy_train").click().run()
    assert not at.exception and "already running" in texts(at.error)
    assert "The form has changed since the toy below was trained" in shown(at.info)
    at = view(at, "Step by step")
    assert at.text_input(key="lab.text").value == "The cat sat on the mat because it was warm."


def test_a_lab_link_restores_the_toy_form_and_the_link_made_from_it_carries_it():
    """Every Lab choice travels in the link, not only the view: a link with the toy form's
    choices opens the form with them, and the link the page offers writes them back."""
    query = {"lab.view": "Toy transformers", "lab.toy_source": "train one now", "lab.toy_task": "sort",
             "lab.toy_heads": "8", "lab.toy_len": "6", "lab.toy_pos": "rotary", "lab.toy_steps": "150"}
    at = AppTest.from_file(PAGE, default_timeout=300)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, at.exception
    assert at.selectbox(key="lab.toy_task").value == "sort"
    assert at.select_slider(key="lab.toy_heads").value == 8
    assert at.slider(key="lab.toy_len").value == 6
    assert at.selectbox(key="lab.toy_pos").value == "rotary"
    assert at.number_input(key="lab.toy_steps").value == 150
    params = shared_view.link_params("lab", at.session_state, {})
    assert {k: params[k] for k in query} == {k: [v] for k, v in query.items()}
