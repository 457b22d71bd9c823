"""The Latency page in AppTest: a tiny sweep on synthetic models draws every figure from the
results; bad input and over-budget sweeps are refused with a message and run nothing."""
import base64
import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from attnviz import results

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "4_Latency.py")
TINY = "synthetic:layers=2,d=32,heads=4,ff=64,vocab=50,positions=64"


def page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    assert not at.exception
    return at


def submit(at: AppTest, **fields) -> AppTest:
    at.multiselect(key="lat_models").set_value(fields.get("models", []))
    at.text_area(key="lat_synthetic").input(fields.get("synthetic", TINY))
    at.text_input(key="lat_seq").input(fields.get("seq", "8,16,32"))
    at.multiselect(key="lat_variants").set_value(fields.get("variants", ["fused", "eager"]))
    at.text_input(key="lat_heads").input(fields.get("heads", "2,4"))
    at.multiselect(key="lat_backends").set_value(fields.get("backends", ["cpu", "pi4"]))
    at.number_input(key="lat_repeats").set_value(fields.get("repeats", 1))
    at.number_input(key="lat_budget_s").set_value(fields.get("budget_s", 120))
    at.button(key="FormSubmitter:lat_form-Run").click().run()
    assert not at.exception
    return at


def values(array) -> list:
    """Plotly JSON arrays arrive as lists or as base64 typed arrays."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def figures(at: AppTest) -> dict[str, dict]:
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    return {s["layout"]["title"]["text"]: s for s in specs}


@pytest.fixture(scope="module")
def ran():
    return submit(page())


def test_page_opens_with_a_hint_and_no_results():
    at = page()
    assert any("press Run" in i.value for i in at.info)
    assert not at.get("plotly_chart") and not at.dataframe


def test_tiny_sweep_draws_every_figure(ran):
    figs = figures(ran)
    titles = " | ".join(figs)
    for words in ("Latency of one forward pass", "log-log", "Where the time goes", "Quadratic fit",
                  "Peak memory", "Tokens per second", "Speed-ups", "Cost model error"):
        assert words in titles, words
    latency = figs["Latency of one forward pass"]
    assert len(latency["data"]) == 2 * 2 * 2  # variants x heads x backends
    assert all(sorted(values(t["x"])) == [8, 16, 32] for t in latency["data"])
    split = next(s for t, s in figs.items() if t.startswith("Where the time goes"))
    assert [t["name"] for t in split["data"]] == ["attention", "projections", "mlp", "other"]


def test_results_table_and_export(ran):
    table = ran.dataframe[0].value
    assert len(table) == 3 * 2 * 2 * 2 and set(table["backend"]) == {"cpu", "pi4"}
    assert set(table["seq_len"]) == {8, 16, 32} and (table["median_ms"] > 0).all()
    exported = ran.session_state["lat_results"]
    assert len(results.read_results(results.to_csv(exported).encode())) == len(table)
    comparisons = ran.dataframe[1].value
    assert {"n 32 → 16", "4 → 2 heads", "fused → eager"} <= set(comparisons["comparison"])
    assert ran.metric[0].label.startswith("Largest cost-model error")


def test_split_and_fit_for_a_device_not_in_the_sweep(ran):
    ran.selectbox(key="lat_split_device").select("pi5").run()
    assert not ran.exception
    figs = figures(ran)
    assert "Where the time goes on pi5 (cost model)" in figs and "Quadratic fit of latency" in figs
    fit = figs["Quadratic fit of latency"]
    assert values(fit["data"][0]["x"]) == [8, 16, 32] and "n²" in fit["data"][1]["name"]
    assert any("at most" in c.value for c in ran.caption)


@pytest.mark.parametrize("fields,words", [
    (dict(seq="0,16"), "positive"),
    (dict(seq="8,128"), "beyond"),
    (dict(synthetic="synthetic:layers=2,d=30,heads=4"), "multiple of heads"),
    (dict(heads="8"), "cannot keep 8"),
    (dict(variants=[]), "at least one attention variant"),
])
def test_bad_input_is_refused(fields, words):
    at = submit(page(), **fields)
    assert any(words in e.value for e in at.error), [e.value for e in at.error]
    assert "lat_results" not in at.session_state


def test_over_budget_sweep_is_refused_before_running():
    at = submit(page(), synthetic="synthetic:layers=12,d=768,heads=12,positions=8192", seq="4096",
                variants=["eager"], heads="all", budget_s=1, repeats=5)
    assert any("budget 1 s" in e.value for e in at.error)
    assert "lat_results" not in at.session_state and not at.get("plotly_chart")


def test_csv_import_errors_are_clear():
    """AppTest cannot upload a file: the page shows read_results' message, checked here."""
    with pytest.raises(ValueError, match="not written by `python -m attnviz.bench`"):
        results.read_results(b"step,loss\n1,0.5\n")
