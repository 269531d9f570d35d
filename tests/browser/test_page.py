"""The web page at / in headless Chromium: paste watermarked text, read the verdict, take a screenshot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import expect

from wmark.keys import KeyRegistry, RegistryConfig

pytestmark = pytest.mark.browser

SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"


@pytest.fixture()
def setup(word_tokenizer_json, planted):
    with KeyRegistry.open(RegistryConfig.from_env()) as reg:
        key = reg.create_key("demo", reg.add_tokenizer(word_tokenizer_json, "words"))
        token = reg.tokens.create("detector", "browser", actor="test").token
        ids = planted(reg.material(key.key_id), 120, np.random.default_rng(21))
    marked = " ".join(f"w{i - 1}" for i in ids)
    human = " ".join(f"w{i}" for i in np.random.default_rng(22).integers(0, 500, size=120))
    return key, token, marked, human


def _click_detect(page) -> None:
    """Click Detect and wait for the answer (each answer has a new audit row number)."""
    before = page.text_content("#audit") or ""
    page.click("#detect")
    expect(page.locator("#audit")).not_to_have_text(before or "(none yet)")
    expect(page.locator("#detect")).to_have_text("Detect")


def _detect(page, text: str) -> str:
    page.fill("#text", "")
    page.focus("#text")
    page.keyboard.insert_text(text)  # what a paste delivers to the textarea
    _click_detect(page)
    return page.get_attribute("#verdict", "data-verdict") or ""


def test_paste_watermarked_text_and_read_the_verdict(live_url, browser_page, setup, tmp_path):
    key, token, marked, human = setup
    page = browser_page
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("request", lambda r: None if r.url.startswith(live_url) else problems.append(f"external {r.url}"))
    page.goto(live_url + "/")

    page.fill("#token", token)
    assert _detect(page, marked) == "watermarked"
    assert page.inner_text("#verdict") == "watermarked"
    p_value = float(page.inner_text("#pvalue"))
    assert 0 < p_value < 1e-6
    assert page.inner_text("#key") == key.key_id
    scored, total = (int(x) for x in page.inner_text("#counts").split(" / "))
    assert total == 120 and 100 < scored <= 120
    spans = page.locator("#highlight span.tok")
    assert spans.count() == 120 and page.locator("#highlight span.unscored").count() == total - scored
    assert page.inner_text("#highlight") == marked  # the text is shown whole, token by token
    colours = page.eval_on_selector_all(
        "#highlight span.tok:not(.unscored)", "els => els.map(e => getComputedStyle(e).backgroundColor)"
    )
    greens = sum(c.startswith("rgba(18, 183, 106") for c in colours)
    assert greens > 0.8 * len(colours)  # watermarked: most pivots are above 1/2
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "page-watermarked.png"), full_page=True)

    assert _detect(page, human) == "not_detected"
    page.screenshot(path=str(SCREENSHOTS / "page-not-detected.png"), full_page=True)

    # a text file chosen (or dropped) instead of pasted
    doc = tmp_path / "doc.txt"
    doc.write_text(marked)
    page.fill("#text", "")
    page.set_input_files("#file", str(doc))
    expect(page.locator("#text")).to_have_value(marked)
    _click_detect(page)
    assert page.get_attribute("#verdict", "data-verdict") == "watermarked"

    # ... or dropped onto the text box
    page.fill("#text", "")
    dropped = page.evaluate_handle(
        "(text) => { const dt = new DataTransfer();"
        " dt.items.add(new File([text], 'drop.txt', {type: 'text/plain'})); return dt; }",
        human,
    )
    page.dispatch_event("#text", "drop", {"dataTransfer": dropped})
    expect(page.locator("#text")).to_have_value(human)
    _click_detect(page)
    assert page.get_attribute("#verdict", "data-verdict") == "not_detected"

    # the token is kept in sessionStorage only when asked, never in localStorage
    assert page.evaluate("sessionStorage.getItem('wmark.token')") is None
    page.check("#remember")
    _click_detect(page)
    assert page.evaluate("sessionStorage.getItem('wmark.token')") == token
    assert page.evaluate("localStorage.length") == 0

    page.fill("#token", "wmt_000000000000_" + "x" * 43)
    page.click("#detect")
    expect(page.locator("#error")).to_contain_text("HTTP 401")
    # the only console error is the browser's own line about the refused request
    assert all("401" in p for p in problems), problems
