"""Lab page, 'Training-time experiments' (AppTest): a cheap experiment runs on the button and shows
its figure and a sentence read from its numbers; the head measures reuse the session's baseline
and measure the sidebar's MiniLM on a few tokens of the evaluation text; a CSV of every result."""
import re
from pathlib import Path

from streamlit.testing.v1 import AppTest

from attnviz.analysis import gradient_heads
from attnviz.ui import lab_experiments

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "5_Lab.py")
PICKER = "model_choice:encoder/lm"


def texts(elements) -> str:
    """What a reader sees: the sentences are markdown-escaped on the page (ui.plain)."""
    return re.sub(r"\\(.)", r"\1", " | ".join(e.value for e in elements))


def run(at, choice: str) -> AppTest:
    at.selectbox(key="lab.exp_choice").select(choice)
    at.number_input(key="lab.exp_steps").set_value(20)
    at.button(key="lab.exp_go").click().run()
    assert not at.exception, at.exception
    return at


def test_an_experiment_shows_its_figure_and_sentence_then_the_measures(monkeypatch):
    monkeypatch.setattr(gradient_heads, "MAX_TOKENS", 16)   # the pretrained measure on 16 tokens
    at = AppTest.from_file(PAGE, default_timeout=300).run()
    at.radio(key="lab.view").set_value(lab_experiments.VIEW).run()
    assert not at.exception, at.exception
    assert "Run trains the baseline and the experiment" in texts(at.caption)
    assert not at.get("plotly_chart")                         # nothing computed before the button

    run(at, "temp:2")
    said = texts(at.info)
    assert "temperature 2 (flatter attention): exact held-out accuracy" in said and "baseline's" in said
    assert any(w in said for w in ("it helped", "it did not help", "no measurable effect"))
    assert len(at.get("plotly_chart")) == 1
    runs = at.session_state["lab.exp_runs"]
    assert set(runs) == {("baseline", 20, 0), ("temp:2", 20, 0)}
    base = runs[("baseline", 20, 0)]
    # the chart shows the figure the sentence quotes (2,000 prompts), not only its 500-prompt curve
    import json
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    finals = {t["name"]: t["y"][0] for t in spec["data"] if t.get("marker", {}).get("symbol") == "diamond"}
    assert finals == {f"{base.label}: final": base.exact, f"{runs[('temp:2', 20, 0)].label}: final":
                      runs[("temp:2", 20, 0)].exact}
    assert f"{100 * base.exact:.1f}%" in said and "◆ final on 2,000" in str(spec["layout"]["annotations"])

    run(at, "gradient")                                       # the toy's baseline again, and MiniLM
    said = texts(at.info)
    assert f"{base.concentration.needed} of 8 heads" in said and "minilm (14 tokens of the evaluation text)" in said
    assert "30% of heads carry 90% of the gradient" in said
    assert len(at.get("plotly_chart")) == 1
    assert set(at.session_state["lab.exp_runs"]) == set(runs)  # no second training of the baseline

    at.selectbox(key=PICKER).select("toy-copy").run()         # not a pretrained model: the toy only
    run(at, "collapse")
    said = texts(at.info)
    assert said.startswith("toy (sort, seed 0, 20 steps): ") and "collapsed" in said
    assert "Pick MiniLM or SmolLM2" in texts(at.caption)
    csv = at.get("download_button")
    assert csv and any("Results CSV" in str(b.proto) for b in csv)
