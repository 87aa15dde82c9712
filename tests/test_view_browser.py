"""The viewer in a real headless browser: Debian's chromium and chromedriver driven by Selenium.

Pages are opened from the campaign folder (file://). On the synthetic demo campaign (no tokenizer) a group's
tokens' loss-mask boxes and version colours are compared with the shard itself; on ``chat_campaign`` (real
episodes, the campaign's tokenizer) the turns read as text, labelled by role with tool calls and results set apart,
and the search box and the filters narrow the list. The browser console must stay free of errors; a failed
assertion names a screenshot of the page at that moment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines_lib.audit.view import build_view, write_view
from pipelines_lib.envs import make_env
from pipelines_lib.stages.view import campaign_view
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


@contextlib.contextmanager
def screenshot_on_failure(browser, shot: Path) -> Iterator[None]:
    """A failed assertion inside names a screenshot of the page as it was then."""
    try:
        yield
    except AssertionError as e:
        browser.save_screenshot(str(shot))
        raise AssertionError(f"{e}\nscreenshot of the page: {shot}") from e


def rows(browser) -> list:
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, "#trajectories tbody tr")


def column(browser, index: int) -> list[str]:
    from selenium.webdriver.common.by import By

    return [r.find_elements(By.TAG_NAME, "td")[index].text for r in rows(browser)]


def matching(browser) -> int:
    """The list's count of matching trajectories (all pages)."""
    from selenium.webdriver.common.by import By

    return int(browser.find_element(By.ID, "shown").text.split()[0])


def console_errors(browser) -> list:
    return [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def test_the_report_opens_a_group_with_tokens_coloured_as_in_the_shard(demo_campaign: Store, browser,
                                                                       tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    path = write_view(demo_campaign, build_view(demo_campaign, max_groups=30))
    browser.get(demo_campaign.uri(path))
    with screenshot_on_failure(browser, tmp_path / "failed.png"):
        assert browser.find_element(By.ID, "title").text == "Campaign demo"
        assert matching(browser) == 30 * 4 and len(rows(browser)) == 50  # 50 a page
        assert "turns show token ids" in browser.find_element(By.ID, "overview").text
        # Filters narrow the list: version 3 only, then a search for one group.
        Select(browser.find_element(By.ID, "version")).select_by_value("3")
        assert rows(browser) and set(column(browser, 3)) == {"3"}
        browser.find_element(By.ID, "q").send_keys("v3-w1-p0@")
        assert len(rows(browser)) == 4
        group_id = rows(browser)[0].get_attribute("data-group")
        assert group_id == "v3-w1-p0@w1"
        rows(browser)[0].click()

        boxes = browser.find_elements(By.CSS_SELECTOR, "#detail .traj")
        shard = next(g["shard"] for g in build_view(demo_campaign, max_groups=60).groups if g["group_id"] == group_id)
        table, _ = read_shard(demo_campaign, shard)
        expected = [r for r in table.to_pylist() if r["group_id"] == group_id]
        assert len(boxes) == len(expected) == 4
        for box, row_ in zip(boxes, sorted(expected, key=lambda r: r["sample_idx"]), strict=True):
            assert box.get_attribute("data-trajectory") == row_["trajectory_id"]
            spans = box.find_elements(By.CSS_SELECTOR, ".tok")
            got = browser.execute_script(
                "return arguments[0].map(s => [s.dataset.id, s.dataset.mask, s.dataset.version, "
                "s.classList.contains('loss'), getComputedStyle(s).backgroundColor, s.textContent])", spans)
            assert [int(t) for t, *_ in got] == row_["tokens"]
            assert [t for *_, t in got] == [str(t) for t in row_["tokens"]]  # no tokenizer: the ids themselves
            assert [int(m) for _, m, *_ in got] == row_["loss_mask"]
            assert [int(boxed) for _, _, _, boxed, *_ in got] == row_["loss_mask"]  # policy tokens are boxed
            assert [int(v) for _, _, v, *_ in got] == row_["policy_version"]
            loss_colours = {c for _, m, _, _, c, _ in got if m == "1"}
            other_colours = {c for _, m, _, _, c, _ in got if m == "0"}
            assert len(loss_colours) == 1 and loss_colours.isdisjoint(other_colours)  # one version: one colour
        text = browser.find_element(By.ID, "detail").text
        assert "calculator" in text and "reward" in text and "correct=" in text

        browser.execute_script("document.getElementById('detail').scrollIntoView()")
        shot = tmp_path / "viewer.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        assert console_errors(browser) == []


def test_turns_read_as_text_by_role_and_the_filters_narrow_the_list(chat_campaign: Store, browser,
                                                                    tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    view = campaign_view(chat_campaign)
    [group] = [g for g in view.groups if g["group_id"] == "arithmetic-v1-t2"]
    right, wrong, no_tool, max_turns = group["trajectories"]
    question = right["prompt"]
    browser.get(chat_campaign.uri(write_view(chat_campaign, view)))
    with screenshot_on_failure(browser, tmp_path / "failed.png"):
        overview = browser.find_element(By.ID, "overview").text
        assert "decoded with the campaign's tokenizer" in overview and "grpo" in overview
        assert len(rows(browser)) == 32
        # The prompt column holds the task's text, not the group id.
        task = type(make_env("arithmetic")).generate_tasks(seed=0, n=3, split="train")[2]
        assert question == task.prompt and column(browser, 2).count(question) == 4

        # Filters: env, then version, then failure kind, then a reward range; each narrows the list.
        env, version, kind = (Select(browser.find_element(By.ID, name)) for name in ("env", "version", "kind"))
        env.select_by_value("multihop")
        assert len(rows(browser)) == 16 and set(column(browser, 1)) == {"multihop"}
        version.select_by_value("1")
        assert len(rows(browser)) == 8 and set(column(browser, 3)) == {"1"}
        kind.select_by_value("max_turns")
        assert len(rows(browser)) == 2 and set(column(browser, 6)) == {"max_turns"}
        kind.select_by_value("ok")
        assert len(rows(browser)) == 6
        browser.find_element(By.ID, "rmin").send_keys("0.5")
        assert len(rows(browser)) == 4 and set(column(browser, 4)) == {"1"}
        browser.find_element(By.ID, "rmin").clear()
        browser.find_element(By.ID, "rmax").send_keys("0.5")
        assert len(rows(browser)) == 2 and set(column(browser, 4)) == {"0"}
        browser.find_element(By.ID, "rmax").clear()
        for select in (env, version, kind):
            select.select_by_value("")
        assert len(rows(browser)) == 32
        # Text search reaches into the decoded turns: the scripted wrong answer is in one sample per group.
        browser.find_element(By.ID, "q").send_keys("<answer>wrong</answer>")
        assert len(rows(browser)) == 8 and set(column(browser, 4)) == {"0"}
        browser.find_element(By.ID, "q").clear()
        browser.find_element(By.ID, "q").send_keys(question)
        assert len(rows(browser)) == 4

        [row] = [r for r in rows(browser) if r.get_attribute("data-trajectory") == right["trajectory_id"]]
        row.click()
        box = browser.find_element(By.CSS_SELECTOR, "#detail .traj.focus")
        assert box.get_attribute("data-trajectory") == right["trajectory_id"]
        turns = box.find_elements(By.CSS_SELECTOR, ".turn")
        assert [t.get_attribute("data-role") for t in turns] == ["system", "user", "assistant", "tool", "assistant"]
        labels = [t.find_element(By.CSS_SELECTOR, ".role").text for t in turns]
        assert labels == ["system", "user", "assistant", "tool result \u2190 calculator", "assistant"]
        # Decoded text is on screen, tool calls and results in their own boxes, the template's markup apart.
        assert question in turns[1].find_element(By.CSS_SELECTOR, "pre.text").text
        call = turns[2].find_element(By.CSS_SELECTOR, ".part.tool_call")
        result = turns[3].find_element(By.CSS_SELECTOR, ".part.tool_result")
        assert call.is_displayed() and '"name": "calculator"' in call.text
        assert result.is_displayed() and result.text.startswith("<tool_response>")
        answer = result.text.removeprefix("<tool_response>").removesuffix("</tool_response>")
        assert f"<answer>{answer}</answer>" in turns[4].find_element(By.CSS_SELECTOR, "pre.text").text
        assert turns[2].find_elements(By.CSS_SELECTOR, ".part.markup")[-1].text == "<|im_end|>"
        # Reward, advantage, stop reason; policy version and how each generated turn ended.
        head = box.find_element(By.CSS_SELECTOR, "h3").text
        assert "reward 1 " in head and "advantage 1.0000" in head and "stop: ok" in head
        for turn in (turns[2], turns[4]):
            assert "policy v1" in turn.text and "ended by its stop token" in turn.text
        heads = [b.find_element(By.CSS_SELECTOR, "h3").text for b in browser.find_elements(By.CSS_SELECTOR, "#detail .traj")]
        assert len(heads) == 4 and "stop: max_turns" in heads[3] and "advantage -1.0000" in heads[1]
        # The token boxes show each token's own text, the id in its data.
        toks = turns[4].find_elements(By.CSS_SELECTOR, ".tok")
        pieces = browser.execute_script("return arguments[0].map(s => [s.dataset.id, s.textContent])", toks)
        assert [int(i) for i, _ in pieces] == right["tokens"][right["turns"][4]["start"]:right["turns"][4]["end"]]
        assert "".join(p for _, p in pieces) == "".join(s for _, s in right["turns"][4]["parts"])

        browser.save_screenshot(str(tmp_path / "chat.png"))
        assert console_errors(browser) == []
