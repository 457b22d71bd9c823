"""Text and image together in a real browser (Streamlit server + Debian's Chromium), on tiny random
models laid out in a Hugging Face cache: CLIP's image-vs-captions view and BLIP's word → patch view.
Their screenshots are kept in bench/screenshots/."""
import pytest

pytest.importorskip("playwright")

from tests import hub_cache  # noqa: E402
from tests.browser import ROOT, assert_no_errors, browser_fixtures, open_page, wait_idle  # noqa: E402
from tests.test_image_text import save_blip, save_dual  # noqa: E402

SHOTS = ROOT / "bench" / "screenshots"


def laid_out(tmp_path_factory) -> dict:
    """A Hugging Face cache holding a tiny CLIP and a tiny BLIP, for the server."""
    root = tmp_path_factory.mktemp("hf") / "hub"
    for name, save in (("clip", lambda f: save_dual(f, "clip")), ("blip", save_blip)):
        folder = tmp_path_factory.mktemp(name)
        save(folder)
        hub_cache.lay_out(root, f"org/{name}", folder)
    return dict(HF_HUB_CACHE=str(root), ATTNVIZ_CACHE=str(tmp_path_factory.mktemp("converted")))


server, browser, page = browser_fixtures({"width": 1400, "height": 2000}, 240_000, laid_out)


def pick(page, server, model: str, view: str):
    open_page(page, server, "Images")
    page.locator('[data-testid="stSidebar"]').get_by_label("Model").click()
    page.get_by_role("option", name=model).click()
    wait_idle(page, 240_000)
    page.get_by_text(view, exact=True).click()             # a segmented control's option
    wait_idle(page)


def test_clip_scores_typed_captions_against_the_photo(page, server):
    from playwright.sync_api import expect
    pick(page, server, "org/clip", "Image ↔ captions")
    box = page.locator('textarea[aria-label="Captions, one per line"]')
    box.fill("a photo of cat\nthe dog on mat\na red car photo")
    box.press("Control+Enter")
    wait_idle(page)
    expect(page.get_by_text("Best match:")).to_be_visible()
    page.wait_for_selector(".js-plotly-plot")
    assert page.locator(".js-plotly-plot text", has_text="a red car photo").count() >= 1
    assert page.locator('[data-testid="stImage"]').count() >= 2       # CLS's reads on the photo
    assert_no_errors(page)
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / "clip-image-vs-captions.png"))


def test_blip_word_reads_the_photo_per_head(page, server):
    from playwright.sync_api import expect
    pick(page, server, "org/blip", "Words → patches")
    box = page.locator('input[aria-label="Text read against the photo"]')
    box.fill("a photo of cat on the mat")
    box.press("Enter")
    wait_idle(page)
    expect(page.get_by_text("P(text matches photo)")).to_be_visible()
    page.get_by_label("Word (query)").click()
    page.get_by_role("option", name="4: cat").click()
    wait_idle(page)
    expect(page.get_by_text("as the query, the photo as keys and values")).to_be_visible()
    assert_no_errors(page)
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / "blip-words-to-patches.png"))
