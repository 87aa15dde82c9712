"""The viewer in a real headless browser: Debian's chromium and chromedriver driven by Selenium.

The page is opened from the campaign folder (file://), a group is opened, its tokens' loss-mask boxes and
version colours are compared with the shard itself, and the browser console must stay free of errors. A
screenshot is kept under the test's tmp dir. Skips, naming the packages, only where chromium is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines_lib.audit.view import build_view, write_view
from pipelines_lib.storage.store import Store
from pipelines_lib.trajectory.codec import read_shard

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason=f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER}): apt-get install chromium "
           "chromium-driver (make sysdeps does this as root)")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)  # the installed browser: Selenium Manager must not fetch one
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1600",
                f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_report_opens_a_group_with_tokens_coloured_as_in_the_shard(demo_campaign: Store, browser,
                                                                       tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    path = write_view(demo_campaign, build_view(demo_campaign, max_groups=30))
    browser.get(demo_campaign.uri(path))
    assert browser.find_element(By.ID, "title").text == "Campaign demo"
    rows = browser.find_elements(By.CSS_SELECTOR, "#groups tbody tr")
    assert len(rows) == 30
    # Filters narrow the list: version 3 only, then a prompt search.
    Select(browser.find_element(By.ID, "version")).select_by_value("3")
    shown = browser.find_elements(By.CSS_SELECTOR, "#groups tbody tr")
    assert shown and all(r.find_elements(By.TAG_NAME, "td")[2].text == "3" for r in shown)
    browser.find_element(By.ID, "q").send_keys("w1-p0")
    [row] = browser.find_elements(By.CSS_SELECTOR, "#groups tbody tr")
    group_id = row.get_attribute("data-group")
    assert group_id == "v3-w1-p0@w1"
    row.click()

    boxes = browser.find_elements(By.CSS_SELECTOR, "#detail .traj")
    shard = next(g["shard"] for g in build_view(demo_campaign, max_groups=60).groups if g["group_id"] == group_id)
    table, _ = read_shard(demo_campaign, shard)
    expected = [r for r in table.to_pylist() if r["group_id"] == group_id]
    assert len(boxes) == len(expected) == 4
    for box, row_ in zip(boxes, sorted(expected, key=lambda r: r["sample_idx"]), strict=True):
        assert box.get_attribute("data-trajectory") == row_["trajectory_id"]
        spans = box.find_elements(By.CSS_SELECTOR, ".tok")
        got = browser.execute_script(
            "return arguments[0].map(s => [s.textContent, s.dataset.mask, s.dataset.version, "
            "s.classList.contains('loss'), getComputedStyle(s).backgroundColor])", spans)
        assert [int(t) for t, *_ in got] == row_["tokens"]
        assert [int(m) for _, m, *_ in got] == row_["loss_mask"]
        assert [int(boxed) for _, _, _, boxed, _ in got] == row_["loss_mask"]  # policy tokens are boxed
        assert [int(v) for _, _, v, *_ in got] == row_["policy_version"]
        loss_colours = {c for _, m, _, _, c in got if m == "1"}
        other_colours = {c for _, m, _, _, c in got if m == "0"}
        assert len(loss_colours) == 1 and loss_colours.isdisjoint(other_colours)  # one version: one colour
    text = browser.find_element(By.ID, "detail").text
    assert "calculator" in text and "reward" in text and "correct=" in text

    browser.execute_script("document.getElementById('detail').scrollIntoView()")
    shot = tmp_path / "viewer.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == []
