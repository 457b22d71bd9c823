"""A newcomer's second pass, the rest, in a real browser (Debian's Chromium driven by Playwright
against `streamlit run`): the spectrogram of a clip with silence has an honest dB scale; a layer
box in Speech's heads-off grid is a pending edit that only Apply transcribes; the Latency sweep's
estimate, from a timed first point, holds against the time the sweep took.

One server for the module; screenshots go to test-artifacts/ (git-ignored).
"""
from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.browser import ARTIFACTS, ROOT, assert_no_errors, browser_fixtures, open_page, wait_idle

TIMEOUT = 120_000
expect.set_options(timeout=TIMEOUT)


server, browser, page = browser_fixtures({"width": 1400, "height": 2400}, TIMEOUT)


def wav(path, seconds_of_silence: float):
    """The bundled clip with digital silence after it."""
    import numpy as np
    import soundfile
    x, rate = soundfile.read(ROOT / "attnviz" / "data" / "audio" / "hello_world.wav", dtype="float32")
    soundfile.write(path, np.concatenate([x, np.zeros(int(rate * seconds_of_silence), np.float32)]), rate)
    return str(path)


def silent_seconds(path) -> float:
    import numpy as np
    import soundfile
    x, rate = soundfile.read(path, dtype="float32")
    n = rate // 100
    chunks = np.abs(x[:len(x) // n * n]).reshape(-1, n).max(1)
    return float((chunks <= 1e-4 * np.abs(x).max()).sum()) / 100


def upload(page, server, path):
    open_page(page, server, "Speech")
    page.locator('[data-testid="stSidebar"]').get_by_text("Upload WAV / FLAC").click()
    wait_idle(page)
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(path)
    wait_idle(page)


def view(page, name: str):
    page.get_by_role("radiogroup").filter(has_text="Word timestamps").get_by_text(name, exact=True).click()
    wait_idle(page)


def test_spectrogram_of_silence_has_a_dark_floor_below_the_peak_and_a_db_bar(page, server, tmp_path):
    """Before: silence was a flat pink block at a fixed -60 dB floor, and nothing said so."""
    upload(page, server, wav(tmp_path / "silence.wav", 1.0))
    chart = page.locator(".js-plotly-plot").filter(has_text="log-mel spectrogram").first
    expect(chart).to_be_visible()
    chart.screenshot(path=str(ARTIFACTS / "33-2-spectrogram.png"))
    mel = chart.evaluate("g => { const t = g._fullData[0]; return {zmin: t.zmin, zmax: t.zmax, "
                         "scale: t.colorscale, bar: t.colorbar.title.text}; }")
    assert mel["zmax"] - mel["zmin"] == 80, mel
    assert "dB" in mel["bar"], mel
    floor = mel["scale"][0][1]       # "#rrggbb" or "rgb(r, g, b)": the floor is the dark end
    rgb = ([int(floor[i:i + 2], 16) for i in (1, 3, 5)] if floor.startswith("#")
           else [int(v) for v in re.findall(r"\d+", floor)])
    assert sum(rgb) < 3 * 40, mel
    caption = page.get_by_text(re.compile(r"\d\.\d s of silence below −80 dB"))
    expect(caption).to_be_visible()
    # the clip's own pauses and the second after it: 10 ms stretches of samples below 1e-4 of its peak
    quiet = float(re.search(r"(\d\.\d) s", caption.inner_text()).group(1))
    assert abs(quiet - silent_seconds(tmp_path / "silence.wav")) <= 0.25, quiet
    assert_no_errors(page)


def transcriptions(page) -> int:
    note = page.get_by_text(re.compile(r"^Transcriptions run in this session: \d+")).first
    expect(note).to_be_visible()
    return int(re.search(r": (\d+)", note.inner_text()).group(1))


def test_speech_layer_box_waits_for_apply_and_apply_transcribes_once(page, server):
    """Before: a layer-box click applied at once and transcribed again (5-14 s a click)."""
    open_page(page, server, "Speech")
    view(page, "Switch heads off")
    before = transcriptions(page)
    grid = page.locator('[class*="st-key-speech-head-grid"]')
    grid.get_by_text("layer 0", exact=True).click()
    wait_idle(page)
    expect(page.get_by_text("6 pending changes")).to_be_visible()
    expect(grid.get_by_role("button", name="h0*", exact=True)).to_be_visible()   # marked as pending
    grid.get_by_text("layer 1", exact=True).click()
    wait_idle(page)
    expect(page.get_by_text("12 pending changes")).to_be_visible()
    assert transcriptions(page) == before                     # two clicks, no transcription
    assert page.get_by_text("With those heads off:").count() == 0
    page.screenshot(path=str(ARTIFACTS / "speech-staged-pending.png"))
    page.get_by_role("button", name="Apply", exact=True).click()
    wait_idle(page)
    expect(page.get_by_text("With those heads off:")).to_be_visible()
    expect(page.get_by_text("No pending changes")).to_be_visible()
    assert transcriptions(page) == before + 1                  # one Apply, one transcription
    grid.get_by_text("layer 1", exact=True).click()           # back on: pending again, Discard undoes it
    wait_idle(page)
    expect(page.get_by_text("6 pending changes")).to_be_visible()
    page.get_by_role("button", name="Discard", exact=True).click()
    wait_idle(page)
    expect(page.get_by_text("No pending changes")).to_be_visible()
    assert transcriptions(page) == before + 1
    assert_no_errors(page)
    page.screenshot(path=str(ARTIFACTS / "speech-staged-applied.png"))


def test_latency_estimate_from_a_timed_first_point_holds_within_2x(page, server):
    """Before: the pre-run figure was the cost model's guess ("about 3 s" took 54 s)."""
    open_page(page, server, "Latency")
    page.locator('input[aria-label="Sequence lengths"]').fill("16,32,64,128")
    page.get_by_text("One block to the crossover").click()        # off: its calibration is timed apart
    page.get_by_role("button", name="Run").click()
    wait_idle(page)
    caption = page.get_by_text(re.compile(r"^Estimated before it ran: about [\d,.]+ s in all"))
    expect(caption).to_be_visible()
    text = caption.inner_text()
    estimate = float(re.search(r"about ([\d,.]+) s", text).group(1).replace(",", ""))
    took = float(re.search(r"it took ([\d,.]+) s", text).group(1).replace(",", ""))
    assert "first point, minilm · fused · n=16" in text
    assert took / 2 <= estimate <= took * 2, text
    assert_no_errors(page)
    page.screenshot(path=str(ARTIFACTS / "latency-estimate.png"))
