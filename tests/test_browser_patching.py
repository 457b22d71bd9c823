"""Activation patching in a real browser (Streamlit server + Debian's Chromium): on the Readouts
page, patching the Mary/John prompt on SmolLM2 gives, within 1e-4, the logit differences that
patching BY HAND gives (module hooks, computed here with the library's model), read from the page's
own CSV download. The screenshot goes to bench/screenshots/31-patching.png."""
import io
from pathlib import Path

import pandas as pd

from attnviz.analysis import patching
from attnviz.weights import catalogue
from tests.browser import assert_no_errors, browser_fixtures, open_page, wait_idle
from tests.test_patching import hand_diff

SHOT = Path(__file__).resolve().parents[1] / "bench" / "screenshots" / "31-patching.png"

server, browser, page = browser_fixtures({"width": 1400, "height": 2400}, 240_000)


def test_mary_john_patching_in_the_browser_matches_patching_by_hand(page, server):
    open_page(page, server, "Readouts?model=smollm2")
    page.get_by_role("radiogroup").get_by_text("Patching", exact=True).click()
    wait_idle(page)
    page.get_by_role("radiogroup").get_by_text("head output", exact=True).click()
    wait_idle(page)
    page.get_by_role("button", name="Run patching").click()
    wait_idle(page, 480_000)
    page.wait_for_selector(".js-plotly-plot")
    assert_no_errors(page)
    with page.expect_download() as download:
        page.get_by_role("button", name="Patching CSV").click()
    frame = pd.read_csv(io.StringIO(Path(download.value.path()).read_text()))
    assert len(frame) == 30 * 9 and set(frame["activation"]) == {"head output"}

    model = catalogue.load_model("smollm2")
    pair = patching.prepare(model, patching.SAMPLE_CLEAN, patching.SAMPLE_CORRUPTED, " Mary", " John")
    clean, corrupted = (model.inputs(t)["ids"].tolist() for t in (patching.SAMPLE_CLEAN, patching.SAMPLE_CORRUPTED))
    top = frame.sort_values("recovered", ascending=False).head(3)
    assert list(zip(top["layer"], top["unit"]))[0] == (23, "H3")
    for layer, unit in [*zip(top["layer"], top["unit"]), (0, "H0")]:
        row = frame[(frame["layer"] == layer) & (frame["unit"] == unit)].iloc[0]
        want = hand_diff(model, clean, corrupted, int(layer), "z", int(unit[1:]), pair.target, pair.minus)
        assert abs(row["patched_logit_diff"] - want) < 1e-4
        recovered = (want - pair.corrupted_diff) / (pair.clean_diff - pair.corrupted_diff)
        assert abs(row["recovered"] - recovered) < 1e-4
    page.get_by_text("Patching measures a head's whole effect").scroll_into_view_if_needed()
    SHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOT))
