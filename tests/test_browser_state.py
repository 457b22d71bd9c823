"""In a real browser: what a user typed survives a view switch, another page and a reload; inputs
that belong to a prompt follow it; the pages' Run / Translate buttons; controls a newcomer must see.

One Streamlit server for the module (tests.browser); screenshots go to test-artifacts/.
"""
from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.browser import ARTIFACTS, assert_no_errors, browser_fixtures, open_page, wait_idle

TIMEOUT = 120_000
expect.set_options(timeout=TIMEOUT)
PROMPT = "The capital of France is"


server, browser, page = browser_fixtures({"width": 1280, "height": 1600}, TIMEOUT)


def view(page, name: str):
    page.locator('[data-testid="stMain"] [role="radiogroup"]').first.get_by_text(name, exact=True).click()
    wait_idle(page)


def test_readouts_prompt_survives_views_pages_and_reload(page, server):
    open_page(page, server, "Readouts")
    box = page.get_by_role("textbox", name="Prompt", exact=True)
    box.fill(PROMPT)
    box.press("Control+Enter")
    wait_idle(page)
    expect(page.get_by_text("Paris").first).to_be_attached()         # the lens ran on the new prompt
    view(page, "Two prompts")
    expect(page.get_by_role("textbox", name="First prompt")).to_be_visible()
    view(page, "Logit lens")
    expect(box).to_have_value(PROMPT)
    page.locator('[data-testid="stSidebar"] [data-testid="stPageLink-NavLink"]').nth(4).click()  # Latency
    page.wait_for_url(re.compile(r"/Latency"))
    wait_idle(page)
    page.locator('[data-testid="stSidebar"] [data-testid="stPageLink-NavLink"]').nth(8).click()  # Readouts
    page.wait_for_url(re.compile(r"/Readouts"))
    wait_idle(page)
    expect(box).to_have_value(PROMPT)
    page.reload()
    page.wait_for_selector('[data-testid="stSidebar"]')
    wait_idle(page)
    expect(box).to_have_value(PROMPT)
    assert_no_errors(page)
    page.screenshot(path=str(ARTIFACTS / "readouts-kept.png"))


def test_attribution_targets_follow_the_prompt(page, server):
    open_page(page, server, "Readouts")
    view(page, "Attribution")
    target = page.get_by_role("textbox", name="Target token", exact=True)
    minus = page.get_by_role("textbox", name="Minus token (optional)", exact=True)
    expect(target).to_have_value(" Mary")                            # the sample's question
    expect(minus).to_have_value(" John")
    box = page.get_by_role("textbox", name="Prompt", exact=True)
    box.fill(PROMPT)
    box.press("Control+Enter")
    wait_idle(page)
    expect(target).to_have_value(" Paris")                           # the model's top next token
    expect(minus).not_to_have_value(" John")
    assert_no_errors(page)


def test_translate_sentence_survives_a_reload(page, server):
    open_page(page, server, "Translate")
    box = page.get_by_role("textbox", name="Sentence", exact=True)
    box.fill("The red bicycle is new.")
    box.press("Control+Enter")
    wait_idle(page)
    expect(page.locator('[data-testid="stMain"] h3').first).to_contain_text(re.compile("bicicleta", re.I))
    page.reload()
    page.wait_for_selector('[data-testid="stSidebar"]')
    wait_idle(page)
    expect(box).to_have_value("The red bicycle is new.")
    assert_no_errors(page)


def test_readouts_and_translate_have_a_run_button(page, server):
    """Ctrl+Enter was the only way to run them; a button runs the typed text (and typing alone
    does not: the box is in a form)."""
    open_page(page, server, "Readouts")
    page.get_by_role("textbox", name="Prompt", exact=True).fill(PROMPT)
    page.get_by_role("button", name="Run", exact=True).click()
    wait_idle(page)
    expect(page.get_by_text("Paris").first).to_be_attached()
    open_page(page, server, "Translate")
    page.get_by_role("textbox", name="Sentence", exact=True).fill("The cat is black.")
    page.get_by_role("button", name="Translate", exact=True).click()
    wait_idle(page)
    expect(page.locator('[data-testid="stMain"] h3').first).to_contain_text(re.compile("gato", re.I))
    assert_no_errors(page)


def test_images_uploader_is_in_the_main_area(page, server):
    open_page(page, server, "Images")
    main = page.locator('[data-testid="stMain"]')
    main.get_by_text("Upload", exact=True).click()
    wait_idle(page)
    expect(main.locator('[data-testid="stFileUploader"]')).to_be_visible()
    assert page.locator('[data-testid="stSidebar"] [data-testid="stFileUploader"]').count() == 0
    page.screenshot(path=str(ARTIFACTS / "images-uploader.png"))


def test_heads_chart_switch_fits_the_page(page, server):
    open_page(page, server, "Heads?model=smollm2")
    chooser = page.get_by_role("radiogroup", name="chart", exact=True)
    last = chooser.get_by_role("radio", name="all three", exact=True)
    expect(last).to_be_visible()
    main = page.locator('[data-testid="stMain"] [data-testid="stMainBlockContainer"]').bounding_box()
    box = last.bounding_box()
    assert box["x"] + box["width"] <= main["x"] + main["width"], (box, main)
    page.screenshot(path=str(ARTIFACTS / "heads-chart-switch.png"))


def test_lab_keeps_its_inputs_and_the_toy_form_matches_its_results(page, server):
    open_page(page, server, "Lab")
    sentence = page.get_by_role("textbox", name="Sentence", exact=True)
    sentence.fill("The cat sat on the mat because it was warm.")
    sentence.press("Enter")
    wait_idle(page)
    view(page, "Toy transformers")
    view(page, "Step by step")
    expect(sentence).to_have_value("The cat sat on the mat because it was warm.")   # another view and back
    view(page, "Toy transformers")
    page.get_by_text("train one now", exact=True).click()
    wait_idle(page)
    page.get_by_role("combobox", name="Task").click()
    page.get_by_role("option", name="reverse", exact=True).click()
    page.get_by_role("spinbutton", name="Steps").fill("50")
    page.get_by_role("button", name="Train", exact=True).click()
    wait_idle(page)
    expect(page.get_by_text(re.compile(r"Trained with: reverse, length 8"))).to_be_visible()
    view(page, "Step by step")
    expect(sentence).to_have_value("The cat sat on the mat because it was warm.")
    view(page, "Toy transformers")
    expect(page.get_by_role("combobox", name="Task")).to_have_value("reverse")
    expect(page.get_by_text(re.compile(r"Trained with: reverse"))).to_be_visible()
    assert_no_errors(page)
    page.screenshot(path=str(ARTIFACTS / "lab-kept.png"))
