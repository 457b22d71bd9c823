"""A newcomer's second pass, in a real browser (Debian's Chromium driven by Playwright against
`streamlit run`): the Latency form does not run on Enter, its table leads with what tells rows
apart and its run reports its own time against its budget; the Speech page's view radio agrees
with the view drawn; the Lab's toy translator draws one node per token.

One server for the module; screenshots go to test-artifacts/ (git-ignored).
"""
from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.browser import ARTIFACTS, assert_no_errors, browser_fixtures, open_page, wait_idle

TIMEOUT = 60_000
expect.set_options(timeout=TIMEOUT)


server, browser, page = browser_fixtures({"width": 1400, "height": 2400}, TIMEOUT)


def test_latency_enter_does_not_run_and_a_run_reports_its_time_within_budget(page, server):
    """Before: Enter in a box of the form started a sweep; the table put engine and dtype at
    its far right (rows looked duplicated); the run said nothing of the time it took."""
    open_page(page, server, "Latency")
    seq = page.locator('input[aria-label="Sequence lengths"]')
    seq.fill("16,32")
    seq.press("Enter")
    wait_idle(page)
    expect(page.get_by_text("Choose models, variants and sequence lengths, then press Run.")).to_be_visible()
    assert page.locator('[data-testid="stDataFrame"]').count() == 0
    page.get_by_text("One block to the crossover").click()        # off: its calibration is a test of its own
    budget = page.locator('input[aria-label="Time budget (s)"]')
    budget.fill("40")
    page.get_by_role("button", name="Run").click()
    wait_idle(page)
    took = page.get_by_text(re.compile(r"^The sweep took \d+ s of its 40 s budget\.$"))
    expect(took).to_be_visible()
    assert int(re.search(r"took (\d+) s", took.inner_text()).group(1)) <= 40
    table = page.locator('[data-testid="stDataFrame"]').first
    table.hover()                       # the grid is a canvas: its column menu lists the columns in order
    table.get_by_role("button", name="Show/hide columns").click()
    menu = page.locator('[data-testid="stDataFrameColumnVisibilityMenu"], [role="dialog"], [data-baseweb="popover"]').first
    expect(menu).to_contain_text("tokens_per_s")
    header = [c.strip() for c in menu.inner_text().splitlines() if c.strip() not in ("", "Select all", "(index)")]
    assert header[:3] == ["backend", "engine", "dtype"], header
    page.keyboard.press("Escape")
    expect(page.locator(".js-plotly-plot").first).to_be_visible()
    assert_no_errors(page)
    page.screenshot(path=str(ARTIFACTS / "second-pass-latency.png"))


def wav(path, seconds_of_silence: float):
    """The bundled clip with silence after it: another upload, the same speech."""
    import numpy as np
    import soundfile
    from tests.browser import ROOT
    x, rate = soundfile.read(ROOT / "attnviz" / "data" / "audio" / "hello_world.wav", dtype="float32")
    soundfile.write(path, np.concatenate([x, np.zeros(int(rate * seconds_of_silence), np.float32)]), rate)
    return str(path)


def test_speech_view_radio_agrees_with_the_view_after_a_new_upload(page, server, tmp_path):
    """Before: after a new upload the radio showed the first view while another was drawn, and a
    click on it did nothing."""
    open_page(page, server, "Speech")
    page.locator('[data-testid="stSidebar"]').get_by_text("Upload WAV / FLAC").click()
    wait_idle(page)
    uploader = page.locator('[data-testid="stFileUploaderDropzoneInput"]')
    uploader.set_input_files(wav(tmp_path / "a.wav", 0.5))
    wait_idle(page)
    views = page.get_by_role("radiogroup").filter(has_text="Word timestamps")
    views.get_by_text("Word timestamps", exact=True).click()
    wait_idle(page)
    expect(page.get_by_text(re.compile(r"^recognition\.?$")).first).to_be_visible()
    uploader.set_input_files(wav(tmp_path / "b.wav", 1.0))   # a new upload replaces the first
    wait_idle(page)
    expect(views.get_by_role("radio", name="Word timestamps", exact=True)).to_be_checked()
    views.get_by_text("Spectrogram & cross-attention", exact=True).click()
    wait_idle(page)
    expect(views.get_by_role("radio", name="Spectrogram & cross-attention", exact=True)).to_be_checked()
    expect(page.locator(".js-plotly-plot").filter(has_text="log-mel spectrogram").first).to_be_visible()
    assert_no_errors(page)
    page.screenshot(path=str(ARTIFACTS / "second-pass-speech.png"))


def test_lab_toy_translator_draws_one_node_per_token_so_the_verb_line_crosses(page, server):
    """Before: each sentence was one node ("catchasesredball"), so the verb's crossing line never showed."""
    open_page(page, server, "Lab")
    page.get_by_role("radiogroup").get_by_text("Toy translator", exact=True).click()
    wait_idle(page)
    chart = page.locator(".js-plotly-plot").last
    expect(chart).to_be_visible()
    labels = chart.locator("text.textpoint, .textpoint text")
    expect(labels.filter(has_text="wo")).to_have_count(1)
    texts = [t.strip() for t in labels.evaluate_all("els => els.map(e => e.textContent)")]
    for word in ("cat", "chases", "red", "ball"):          # the default sentence
        assert texts.count(word) == 2, texts          # once in the source row, once in the target row
    assert "ga" in texts and not any("catchases" in t for t in texts)
    assert_no_errors(page)
    chart.screenshot(path=str(ARTIFACTS / "second-pass-toy-translator.png"))
