"""End to end in a real browser: Debian's Chromium driven by Playwright against `streamlit run`.

Screenshots go to test-artifacts/ (git-ignored); look at them when a test fails.
"""
from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.browser import ARTIFACTS, assert_no_errors, browser_fixtures, open_page, wait_idle

TIMEOUT = 120_000
# Playwright assertions wait 5 s by default, too little for a rerun on a loaded 2-core machine.
expect.set_options(timeout=TIMEOUT)


server, browser, page = browser_fixtures({"width": 1400, "height": 2200}, TIMEOUT)


def test_attention_paste_run_heatmap(page, server):
    open_page(page, server, "Attention")
    box = page.locator('textarea[aria-label="Text"]')
    box.fill("The pilot landed the plane because she was skilled.")
    page.get_by_role("button", name="Run").click()
    wait_idle(page)
    expect(page.get_by_text("pilot", exact=False).first).to_be_visible()
    detail = page.locator(".js-plotly-plot").nth(1)   # 0: overview, 1: detail heatmap
    expect(detail.locator(".heatmaplayer, image").first).to_be_attached()
    assert page.locator('[data-testid="stException"]').count() == 0
    page.screenshot(path=str(ARTIFACTS / "attention.png"))


def test_attention_view_choice_outlives_downloads_and_buttons(page, server):
    """A first download (and "Compute head scores") jumped back to the Detail tab and
    hid the result. The chosen view is remembered; a download does not even rerun the page."""
    open_page(page, server, "Attention")
    views = page.get_by_role("radiogroup", name="View")
    views.get_by_text("Statistics", exact=True).click()
    wait_idle(page)
    expect(page.get_by_role("button", name="Statistics CSV")).to_be_visible()
    with page.expect_download() as download:
        page.get_by_role("button", name="Statistics CSV").click()
    assert download.value.suggested_filename == "head_stats.csv"
    wait_idle(page)
    expect(views.get_by_role("radio", name="Statistics", exact=True)).to_be_checked()
    expect(page.get_by_role("button", name="Statistics CSV")).to_be_visible()
    page.get_by_text("Scale each head to its own maximum").click()   # another widget's rerun
    wait_idle(page)
    expect(views.get_by_role("radio", name="Statistics", exact=True)).to_be_checked()
    views.get_by_text("Export", exact=True).click()
    wait_idle(page)
    with page.expect_download() as download:
        page.get_by_role("button", name="Attentions NPZ").click()
    assert download.value.suggested_filename == "attentions.npz"
    wait_idle(page)
    expect(views.get_by_role("radio", name="Export", exact=True)).to_be_checked()
    expect(page.get_by_role("button", name="Overview PNG")).to_be_visible()
    assert_no_errors(page)
    page.screenshot(path=str(ARTIFACTS / "attention-views.png"))


def test_images_upload_photo(page, server, tmp_path):
    from attnviz.uploads.images import sample_images
    open_page(page, server, "Images")
    page.get_by_text("Upload", exact=True).click()
    wait_idle(page)
    page.locator('input[type="file"]').set_input_files(str(sample_images()["coffee"]))
    wait_idle(page)
    expect(page.get_by_text("coffee", exact=False).first).to_be_visible()
    assert_no_errors(page)
    expect(page.locator('[data-testid="stImage"] img').first).to_be_visible()
    page.screenshot(path=str(ARTIFACTS / "images.png"))


def test_heads_toggle_changes_the_output(page, server):
    open_page(page, server, "Heads?model=minilm")
    cosine = page.locator('[data-testid="stMetricValue"]').first
    expect(cosine).to_have_text("1.0000")  # every head on: the masked model is the full model
    page.get_by_text("layer 0", exact=True).click()   # switch off every head of layer 0: pending
    wait_idle(page)
    expect(page.get_by_text("12 pending changes", exact=False)).to_be_visible()
    expect(cosine).to_have_text("1.0000")             # like every edit, it waits for Apply
    page.get_by_role("button", name="Apply", exact=True).click()
    wait_idle(page)
    expect(page.get_by_text("60 of 72 heads on", exact=False)).to_be_visible()
    expect(cosine).not_to_have_text("1.0000")
    assert float(cosine.inner_text()) < 1.0
    assert "heads=" in page.url          # the mask travels in the link
    page.screenshot(path=str(ARTIFACTS / "heads.png"))


def head_button(page, layer, head):
    """Head `head`'s button in layer `layer`'s row of the Heads page's mask (a form: Apply submits)."""
    return page.get_by_role("toolbar", name=f"heads on in layer {layer}", exact=True).get_by_role(
        "button", name=re.compile(rf"^h{head}\*?$"))   # "h3*" while its edit waits for Apply


def test_heads_several_toggles_then_one_apply(page, server):
    open_page(page, server, "Heads?model=minilm")
    cosine = page.locator('[data-testid="stMetricValue"]').first
    expect(cosine).to_have_text("1.0000")
    for layer, head in ((1, 2), (3, 5), (4, 7)):      # edits: the grid changes, the result not yet
        head_button(page, layer, head).click()
        expect(head_button(page, layer, head)).to_have_attribute("aria-pressed", "false")
        wait_idle(page)
    expect(page.get_by_text("3 pending changes", exact=False)).to_be_visible()
    expect(page.get_by_text("layer 1 ◐", exact=True)).to_be_visible()   # a partial layer says so
    expect(page.get_by_text("72 of 72 heads on", exact=False)).to_be_visible()
    expect(cosine).to_have_text("1.0000")
    page.get_by_role("button", name="Apply", exact=True).click()  # one run for the three
    wait_idle(page)
    expect(page.get_by_text("69 of 72 heads on", exact=False)).to_be_visible()
    expect(cosine).to_have_text(re.compile(r"^0\.\d{4}$"))   # below 1: the three heads are off
    expect(page).to_have_url(re.compile(r"heads=6x12-"))      # the applied mask travels in the link
    assert_no_errors(page)
    page.screenshot(path=str(ARTIFACTS / "heads-apply.png"))


def test_heads_chart_choice_redraws_the_chosen_charts(page, server):
    """A language model's live view draws the chart the user picked (one by default, all three on
    request) and a change of chart does not lose the result."""
    open_page(page, server, "Heads?model=smollm2")
    plots = page.locator(".js-plotly-plot")
    expect(plots).to_have_count(1)                   # next-token bars, the default
    expect(page.get_by_text("next token — masked")).to_be_visible()
    chooser = page.get_by_role("radiogroup", name="chart", exact=True)
    chooser.get_by_role("radio", name="all three", exact=True).click()
    wait_idle(page)
    expect(plots).to_have_count(3)
    expect(page.get_by_text("attention masked − full", exact=False)).to_be_attached()
    chooser.get_by_role("radio", name="per-token loss", exact=True).click()
    wait_idle(page)
    expect(plots).to_have_count(1)
    expect(page.locator('[data-testid="stMetricValue"]').first).to_have_text(re.compile(r"^\d+\.\d\d$"))
    assert_no_errors(page)
    page.screenshot(path=str(ARTIFACTS / "heads-charts.png"))


def test_latency_tiny_sweep(page, server):
    open_page(page, server, "Latency")
    seq = page.locator('input[aria-label="Sequence lengths"]')
    seq.fill("16,32")
    page.get_by_role("button", name="Run").click()
    wait_idle(page)
    expect(page.locator(".js-plotly-plot").first).to_be_visible()
    assert_no_errors(page)
    page.screenshot(path=str(ARTIFACTS / "latency.png"))


def test_sidebar_links_start_with_home_and_lead_to_every_page(page, server):
    """Streamlit's own list named the home page "app"; ours (attnviz.ui.common.sidebar_nav)
    says Home, then each page, and its links navigate."""
    open_page(page, server)
    sidebar = page.locator('[data-testid="stSidebar"]')
    links = sidebar.locator('[data-testid="stPageLink-NavLink"]')
    expect(links).to_have_count(9)
    expect(sidebar.locator('[data-testid="stSidebarNav"]')).to_have_count(0)   # Streamlit's own list is off
    label = links.first.locator('[data-testid="stMarkdownContainer"]')
    expect(label).to_have_text("Home")
    assert "app" not in [t.strip() for t in links.locator('[data-testid="stMarkdownContainer"]').all_inner_texts()]
    links.nth(4).click()                                  # Latency: a page without a model picker
    page.wait_for_url(re.compile(r"/Latency$"))
    wait_idle(page)
    expect(page.get_by_role("heading", name="Latency").first).to_be_visible()
    expect(page.locator('[data-testid="stSidebar"] [data-testid="stPageLink-NavLink"]').first).to_contain_text("Home")
    page.locator('[data-testid="stSidebar"] [data-testid="stPageLink-NavLink"]').first.click()
    page.wait_for_url(re.compile(r"127\.0\.0\.1:\d+/?$"))
    wait_idle(page)
    expect(page.get_by_text("Bundled models").first).to_be_visible()
    assert_no_errors(page)
    page.screenshot(path=str(ARTIFACTS / "sidebar-links.png"))


def choose(page, label: str, option: str):
    """Pick `option` in the selectbox labelled `label` (typing filters Streamlit's list)."""
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text=label).first
    box.click()
    box.locator("input").fill(option)
    page.get_by_role("option", name=option, exact=True).first.click()
    wait_idle(page)


def test_chinese_sample_minilm_names_the_readers_then_smollm2_shows_characters(page, server):
    """MiniLM's warning on Chinese did not say which bundled model reads it; on SmolLM2 the
    sample reads as characters and Find heads opens on 它 → 苹果 (its completing token 果)."""
    open_page(page, server, "Attention")
    choose(page, "Sample sentences", "我吃了一个苹果，它很甜")
    warning = page.locator('[data-testid="stAlertContentWarning"]').filter(has_text="vocabulary")
    expect(warning).to_contain_text("e5-small and smollm2")
    expect(warning).to_contain_text("read Chinese characters with no [UNK]")
    page.screenshot(path=str(ARTIFACTS / "chinese-minilm.png"))
    choose(page, "Model", "smollm2 (llama)")
    expect(page.get_by_text("苹… · 苹… · 苹 · 果", exact=False).first).to_be_visible()
    page.get_by_text("Find heads", exact=True).click()
    wait_idle(page)
    expect(page.get_by_text("Top heads: 它 → 苹", exact=False).first).to_be_attached()   # the word 苹 · 果
    assert_no_errors(page)
    page.screenshot(path=str(ARTIFACTS / "chinese-smollm2.png"))
