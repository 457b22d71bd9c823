"""In a real browser: on each of the eight pages, a non-default view (a layer, a head, a view, a
typed text, a head switched off) is taken from the link the page offers ("Share this view") and
opened in a fresh browser context, where the same view is shown. A text too long for a link goes
through "Save view" and "Open a saved view" instead.

One Streamlit server for the module (tests.browser); screenshots go to test-artifacts/.
"""
from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from tests.browser import ARTIFACTS, assert_no_errors, browser_fixtures, open_page, wait_idle

TIMEOUT = 180_000
expect.set_options(timeout=TIMEOUT)
VIEWPORT = {"width": 1400, "height": 2200}

server, browser, page = browser_fixtures(VIEWPORT, TIMEOUT)


def shared_link(page) -> str:
    """The link in the sidebar's "Share this view" box (the one st.code copies)."""
    sidebar = page.locator('[data-testid="stSidebar"]')
    code = sidebar.locator('[data-testid="stCode"] code')
    if code.first.is_visible():      # open already: a change beside the head editor needs a refresh
        sidebar.get_by_role("button", name="Refresh the link").click()
    else:                            # opening the box makes the link afresh
        sidebar.get_by_text("Share this view", exact=True).click()
    wait_idle(page)
    expect(code.first).to_contain_text("http://")
    return code.first.inner_text().strip()


@pytest.fixture
def fresh(browser):
    """A second, fresh browser context (no session, no cookies): open(link) -> its page."""
    contexts = []

    def open_link(link: str):
        context = browser.new_context(viewport=VIEWPORT)
        contexts.append(context)
        pg = context.new_page()
        pg.set_default_timeout(TIMEOUT)
        pg.goto(link)
        pg.wait_for_selector('[data-testid="stSidebar"]')
        wait_idle(pg)
        return pg

    yield open_link
    for context in contexts:
        context.close()


def choose(page, label: str, option: str):
    """Pick `option` in the main area's selectbox labelled `label`."""
    box = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"]').filter(has_text=label).first
    box.click()
    box.locator("input").fill(option)
    page.get_by_role("option", name=option, exact=True).first.click()
    wait_idle(page)


def view(page, name: str, group: str = "View"):
    page.get_by_role("radiogroup", name=group).first.get_by_text(name, exact=True).click()
    wait_idle(page)


def checked(page, name: str, group: str = "View"):
    expect(page.get_by_role("radiogroup", name=group).first.get_by_role("radio", name=name, exact=True)).to_be_checked()


def selected(page, label: str, option: str):
    box = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"]').filter(has_text=label).first
    expect(box).to_match_aria_snapshot(f'- combobox "{label}": "{option}"')


def test_attention_link_restores_text_layer_head_and_view(page, server, fresh):
    open_page(page, server, "Attention")
    text = "The pilot landed the plane because she was skilled."
    page.locator('textarea[aria-label="Text"]').fill(text)
    page.get_by_role("button", name="Run").click()
    wait_idle(page)
    choose(page, "Layer", "2")
    choose(page, "Head", "3")
    view(page, "Lines")
    expect(page.get_by_role("heading", name="Layer 2, head 3")).to_be_visible()
    link = shared_link(page)
    assert "attention.layer=2" in link and "attention.head=3" in link and "pilot" in link
    other = fresh(link)
    expect(other.locator('textarea[aria-label="Text"]')).to_have_value(text)
    expect(other.get_by_role("heading", name="Layer 2, head 3")).to_be_visible()
    checked(other, "Lines")
    selected(other, "Layer", "2")
    assert_no_errors(other)
    other.screenshot(path=str(ARTIFACTS / "share-attention.png"))


def head_button(page, layer, head):
    return page.get_by_role("toolbar", name=f"heads on in layer {layer}", exact=True).get_by_role(
        "button", name=re.compile(rf"^h{head}\*?$"))   # "h3*" while its edit waits for Apply


def test_heads_link_restores_text_mask_and_tool(page, server, fresh):
    open_page(page, server, "Heads?model=minilm")
    box = page.locator('textarea[aria-label="Text"]')
    box.fill("A dog runs across the park.")
    box.press("Control+Enter")
    wait_idle(page)
    head_button(page, 1, 2).click()
    wait_idle(page)
    page.get_by_role("button", name="Apply").click()
    wait_idle(page)
    expect(page.get_by_text("71 of 72 heads on", exact=False)).to_be_visible()
    page.get_by_role("radiogroup").filter(has_text="Pruning curve").first.get_by_text("Pruning curve", exact=True).click()
    wait_idle(page)
    link = shared_link(page)
    assert "heads=6x12-" in link
    other = fresh(link)
    expect(other.locator('textarea[aria-label="Text"]')).to_have_value("A dog runs across the park.")
    expect(other.get_by_text("71 of 72 heads on", exact=False)).to_be_visible()
    expect(head_button(other, 1, 2)).to_have_attribute("aria-pressed", "false")
    expect(other.get_by_role("radio", name="Pruning curve", exact=True)).to_be_checked()
    assert_no_errors(other)


def test_images_link_restores_view_and_choices(page, server, fresh):
    open_page(page, server, "Images")
    view(page, "Every layer × head", "Show")
    view(page, "one scale for all tiles", "Colour scale")
    link = shared_link(page)
    other = fresh(link)
    expect(other.get_by_role("radio", name="Every layer × head", exact=True)).to_be_checked()
    expect(other.get_by_role("radio", name="one scale for all tiles", exact=True)).to_be_checked()
    assert_no_errors(other)


def test_latency_link_restores_the_sweep_form(page, server, fresh):
    open_page(page, server, "Latency")
    seq = page.locator('input[aria-label="Sequence lengths"]')
    seq.fill("16,32")
    page.get_by_role("radiogroup", name="Clock").get_by_text("cpu", exact=True).click()
    page.get_by_role("button", name="Run").click()
    wait_idle(page)
    expect(page.locator(".js-plotly-plot").first).to_be_visible()
    view(page, "Memory")
    link = shared_link(page)
    assert "latency.seq=16%2C32" in link
    other = fresh(link)
    expect(other.locator('input[aria-label="Sequence lengths"]')).to_have_value("16,32")
    expect(other.get_by_role("radiogroup", name="Clock").get_by_role("radio", name="cpu")).to_be_checked()
    assert_no_errors(other)


def test_lab_link_restores_view_mode_and_head(page, server, fresh):
    open_page(page, server, "Lab")
    view(page, "All steps", "Show")
    layer = page.get_by_role("spinbutton", name="Layer", exact=True)
    layer.fill("3")
    layer.press("Enter")
    wait_idle(page)
    link = shared_link(page)
    other = fresh(link)
    expect(other.get_by_role("radio", name="All steps", exact=True)).to_be_checked()
    expect(other.get_by_role("spinbutton", name="Layer", exact=True)).to_have_value("3")
    assert_no_errors(other)


def test_translate_link_restores_sentence_view_and_head(page, server, fresh):
    open_page(page, server, "Translate")
    box = page.get_by_role("textbox", name="Sentence", exact=True)
    box.fill("The red bicycle is new.")
    box.press("Control+Enter")
    wait_idle(page)
    view(page, "Encoder self-attention")
    choose(page, "Head", "2")
    link = shared_link(page)
    other = fresh(link)
    expect(other.get_by_role("textbox", name="Sentence", exact=True)).to_have_value("The red bicycle is new.")
    checked(other, "Encoder self-attention")
    selected(other, "Head", "2")
    expect(other.locator('[data-testid="stMain"] h3').first).to_contain_text(re.compile("bicicleta", re.I))
    assert_no_errors(other)


def test_speech_link_restores_the_view(page, server, fresh):
    open_page(page, server, "Speech")
    view(page, "Word timestamps")
    link = shared_link(page)
    other = fresh(link)
    checked(other, "Word timestamps")
    assert_no_errors(other)


def test_readouts_link_restores_the_patching_prompts(page, server, fresh):
    open_page(page, server, "Readouts")
    view(page, "Patching")
    clean = page.get_by_role("textbox", name="Clean prompt", exact=True)
    clean.fill("When Anna and Tom went to the park, Tom gave a ball to")
    clean.press("Enter")
    wait_idle(page)
    corrupted = page.get_by_role("textbox", name="Corrupted prompt", exact=True)
    corrupted.fill("When Anna and Tom went to the park, Anna gave a ball to")
    corrupted.press("Enter")
    wait_idle(page)
    link = shared_link(page)
    other = fresh(link)
    checked(other, "Patching")
    expect(other.get_by_role("textbox", name="Clean prompt", exact=True)).to_have_value(
        "When Anna and Tom went to the park, Tom gave a ball to")
    expect(other.get_by_role("textbox", name="Corrupted prompt", exact=True)).to_have_value(
        "When Anna and Tom went to the park, Anna gave a ball to")
    assert_no_errors(other)


def test_a_long_text_goes_in_the_saved_file_and_comes_back(page, server, fresh, tmp_path):
    open_page(page, server, "Attention")
    text = " ".join(["The cat sat on the mat and looked at the bird."] * 50)     # ~2,350 characters
    page.locator('textarea[aria-label="Text"]').fill(text)
    page.get_by_role("button", name="Run").click()
    wait_idle(page)
    expect(page.get_by_text("too long for a link", exact=False)).to_be_visible()
    choose(page, "Head", "5")
    link = shared_link(page)
    assert "attention.text" not in link and "attention.head=5" in link
    with page.expect_download() as download:
        page.get_by_role("button", name="Save view").click()
    path = tmp_path / download.value.suggested_filename
    download.value.save_as(path)
    saved = json.loads(path.read_text())
    assert saved["page"] == "attention" and saved["state"]["attention.text"] == text
    other = fresh(f"{server}/Attention")
    sidebar = other.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text("Share this view", exact=True).click()
    sidebar.locator('input[type="file"]').set_input_files(str(path))
    wait_idle(other)
    expect(sidebar.get_by_text("value(s) read", exact=False)).to_be_visible()
    expect(other.locator('textarea[aria-label="Text"]')).to_have_value(text)
    selected(other, "Head", "5")
    assert_no_errors(other)
    other.screenshot(path=str(ARTIFACTS / "share-saved-view.png"))
