"""The evaluation's page in a real browser: two labellers (Debian's headless Chromium, driven by selenium, a profile
each) compare two policies' responses, a kill -9 stops the evaluation half-way, and the same command continues it on
the same port until every item has its K = 2 labels; results.json holds the figures the clicks give.

Needs `chromium` and `chromedriver` (helpers/browser.py: skipped without them, except under CI=true)."""

from __future__ import annotations

import json
import signal

from helpers.browser import WAIT_S, give_name, page_wait
from helpers.evaluation import happy_policy, start_page_evaluation
from helpers.labelling import tiny_offline_cache
from helpers.processes import free_port


def test_two_labellers_compare_two_policies_across_a_kill_9(assets, tmp_path, two_browsers):
    from selenium.webdriver.common.by import By

    cache = tiny_offline_cache(tmp_path / "cache", assets)
    happy = happy_policy(assets, tmp_path / "happy")
    out = tmp_path / "eval"
    flags = ["--task", "offline", "--policies", happy, "zero-shot", "--labels-per-item", "2", "--num-queries", "3",
             "--device", "cpu", "--port", free_port(), "--output-dir", out]
    ann, bob = two_browsers
    choices = {"ann": [0, 1, 0], "bob": [0, 0, 1]}  # the side chosen on items 1, 2 and 3

    def label(browser, name: str, items: range) -> None:
        wait = page_wait(browser)
        shown = lambda: browser.find_element(By.ID, "index").get_attribute("textContent")  # noqa: E731
        for k in items:
            wait.until(lambda d: shown() == f"#{k + 1} of 3")
            assert len(browser.find_elements(By.CSS_SELECTOR, ".sample")) == 2  # two responses, no more
            browser.find_element(By.ID, f"sample{choices[name][k]}").click()

    proc, url, _ = start_page_evaluation(cache, tmp_path, *flags)
    try:
        for browser, name in ((ann, "ann"), (bob, "bob")):
            browser.get(url)
            give_name(browser, name)
        label(ann, "ann", range(3))
        label(bob, "bob", range(1))
        page_wait(bob).until(lambda d: "4 / 6 labels" in d.find_element(By.ID, "counts").text)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    assert not (out / "results.json").exists()

    proc, url, lines = start_page_evaluation(cache, tmp_path, *flags)  # the same command, the same port
    try:
        assert "4 of 6 labels given" in "\n".join(lines)
        bob.get(url)  # a reload: the name stays with the browser
        label(bob, "bob", range(1, 3))
        assert proc.wait(WAIT_S) == 0  # every item has its two labels: the evaluation ends by itself
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
    printed = proc.stdout.read()
    header = json.loads((out / "comparisons.json.session.jsonl").read_text().splitlines()[0])
    records = json.loads((out / "comparisons.json").read_text())
    assert [r["labels"] for r in records] == [[{"labeller": "ann", "best": a}, {"labeller": "bob", "best": b}]
                                              for a, b in zip(choices["ann"], choices["bob"])]
    # item 1: both chose the left one, a win for it; items 2 and 3 are 1 to 1, half a win each
    first_left = header["items"][0]["policies"][0]
    (pair,) = json.loads((out / "results.json").read_text())["pairs"]
    assert pair["items"] == 3 and pair["ties"] == 2 and pair["wins"][first_left] == 1
    assert pair["win_rate"][first_left]["value"] == 2 / 3
    assert pair["position_bias"]["left_share"]["value"] == 4 / 6  # ann 0, 1, 0 and bob 0, 0, 1: four lefts of six
    assert pair["agreement"]["overall"] == {"pairs": 3, "agree": 1, "share": 1 / 3}
    assert "majority of 2" in printed
