"""Eight browser sessions at once against one server and one cached model: nobody sees anybody
else's text, mask or results, and the shared model's weights never change."""
import json
import re
import statistics

import pytest
from playwright.sync_api import sync_playwright

import attnviz
from tests.browser import (ARGS, ARTIFACTS, CHROMIUM, expected_cosine, run_sessions, session_mask,
                           streamlit_server, wait_idle)

N_SESSIONS, ROUNDS = 8, 2
# eight sessions on one server keep both cores busy: never beside another test that does
pytestmark = pytest.mark.xdist_group("whole_machine")


def home_fingerprint(url: str) -> str:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.set_default_timeout(120_000)
        page.goto(url)
        wait_idle(page)
        page.get_by_text("Weights fingerprint").click()
        code = page.locator('[data-testid="stCode"] code').first
        code.wait_for()
        value = code.inner_text().strip()
        browser.close()
    return value


@pytest.fixture(scope="module")
def minilm():
    return attnviz.load_model("minilm")


@pytest.mark.timeout(900)
def test_eight_sessions_stay_apart(minilm):
    ARTIFACTS.mkdir(exist_ok=True)
    with streamlit_server() as url:
        before = home_fingerprint(url)
        seen, times = run_sessions(url, N_SESSIONS, ROUNDS, shots=ARTIFACTS)
        after = home_fingerprint(url)
    assert before == after == minilm.fingerprint()
    assert len(seen) == N_SESSIONS * ROUNDS
    for o in seen:
        k = o["session"]
        keep = session_mask(k)
        assert o["box"] == o["text"]                                  # its own text
        assert re.search(rf"\b{int(keep.sum())} of 72 heads on", o["caption"]), o   # its own mask
        assert "heads=" in o["url"]
        assert o["cosine"] == pytest.approx(expected_cosine(minilm, o["text"], keep), abs=1e-4)  # its own result
    (ARTIFACTS / "concurrency.json").write_text(json.dumps(dict(
        sessions=N_SESSIONS, rounds=ROUNDS, p50=statistics.median(times),
        p95=statistics.quantiles(times, n=20)[-1], times=times), indent=1))
