"""Real-browser screenshot of the Translate page's decoder view: Gemma 3 270M writing 我爱你 for
"I love you.", 爱's row over the English words with its strongest head, beside en→pt's "amo" → "love".

    PYTHONPATH=$PWD .venv/bin/python bench/screenshot_love.py   # writes bench/screenshots/45-3-ai-love.png

Needs Debian's chromium and a CJK font (fonts-wqy-zenhei), as tests/browser.py does.
"""
from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.browser import ARGS, ARTIFACTS, CHROMIUM, open_page, streamlit_server, wait_idle  # noqa: E402

VIEW = "A decoder translating (Gemma, 爱 → love)"
OUT = ROOT / "bench" / "screenshots" / "45-3-ai-love.png"


def main():
    ARTIFACTS.mkdir(exist_ok=True)
    with streamlit_server() as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_context(viewport={"width": 1500, "height": 2000}).new_page()
        page.set_default_timeout(400_000)
        open_page(page, url, "Translate")
        page.get_by_text(VIEW, exact=True).click()
        wait_idle(page, 400_000)
        page.wait_for_selector("text=It continues:")
        page.wait_for_selector("text=Writing “amo”")
        page.wait_for_timeout(1500)           # plotly draws after the rerun ends
        assert page.locator('[data-testid="stException"]').count() == 0
        page.locator('[data-testid="stMain"]').screenshot(path=str(OUT))
        browser.close()
    print(OUT)


if __name__ == "__main__":
    main()
