"""The Lab's image reader in a real browser (Streamlit server + Debian's Chromium): from the Images
page's link to the Lab's view, a training, a string read and its cross-attention drawn on the picture."""
import pytest

pytest.importorskip("playwright")

from tests.browser import ARTIFACTS, assert_no_errors, browser_fixtures, open_page, wait_idle  # noqa: E402

server, browser, page = browser_fixtures({"width": 1300, "height": 2400}, 240_000)


def test_text_reads_an_image_in_the_lab(page, server):
    from playwright.sync_api import expect
    open_page(page, server, "Images")
    page.get_by_role("button", name="Text attending to an image").click()
    wait_idle(page)
    expect(page.get_by_text("Trained here in the Lab, not a pretrained model")).to_be_visible()
    expect(page.get_by_text("Held-out pictures read exactly")).to_be_visible()   # the reader shipped
    expect(page.get_by_text("The reader reads 90417: read exactly.")).to_be_visible()
    assert page.locator('[data-testid="stImage"]').count() >= 2
    assert_no_errors(page)
    page.screenshot(path=str(ARTIFACTS / "29-text-image.png"), full_page=True)
    page.get_by_role("spinbutton", name="Steps").fill("100")
    page.get_by_role("button", name="Train").click()
    wait_idle(page, 240_000)
    expect(page.get_by_text("Trained here in the Lab: 100 steps")).to_be_visible()
    assert_no_errors(page)
