"""The labelling page in a real browser: Debian's headless Chromium, driven by selenium with real clicks and key
presses, labels items of the offline task on the tool's default port, goes on labelling after a kill -9 and a restart
on that port; the file it writes trains a reward model.

Needs `chromium` and `chromedriver` (Debian: apt-get install chromium chromium-driver; .ci/run installs them). Without
them the test is skipped, except under CI=true, where it fails. LMHP_UPDATE_SCREENSHOT=1 also copies the page's
screenshot to docs/labelling.png (the one docs/labelling.md shows).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import tempfile

import pytest
from helpers.browser import give_name, page_wait
from helpers.labelling import ROOT, journal_items, label_env, read_labels, start_server, tiny_offline_cache
from helpers.processes import differing, in_process

from lm_human_preference_details import agreement


@pytest.fixture()
def default_port():
    """The tool's default port belongs to the machine, not to one test run: a second suite on the same machine (two
    checkouts, a CI job beside a developer's run) waits here for this test to end instead of finding the port in use."""
    with open(os.path.join(tempfile.gettempdir(), "lmhp-tests-default-label-port.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def test_label_undo_skip_kill_restart_then_train_on_the_file(assets, tmp_path, browser, default_port):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    cache = tiny_offline_cache(tmp_path / "cache", assets)
    out = tmp_path / "labels.json"
    proc, url, _ = start_server(cache, out, port=None)  # the default port, as users run it
    shown = lambda: browser.find_element(By.ID, "index").get_attribute("textContent")  # noqa: E731  "#3 of 8"
    try:
        browser.get(url)
        give_name(browser, "ann")
        wait = page_wait(browser)
        wait.until(lambda d: shown() == "#1 of 8")
        assert browser.find_element(By.ID, "name").text == "ann"  # in the header, kept by the browser

        def act(action, then: str) -> None:  # a click or a key press, then wait for the page to show the next item
            action()
            wait.until(lambda d: shown() == then)

        click = lambda i: lambda: browser.find_element(By.ID, f"sample{i}").click()  # noqa: E731
        press = lambda key: lambda: ActionChains(browser).send_keys(key).perform()  # noqa: E731
        act(click(1), "#2 of 8")  # item 0: response 2, clicked
        act(press("3"), "#3 of 8")  # item 1: key 3
        act(click(0), "#4 of 8")
        act(press("4"), "#5 of 8")
        act(click(2), "#6 of 8")  # five labels
        act(press("u"), "#5 of 8")  # undo: item 4 comes back
        act(lambda: browser.find_element(By.ID, "skip").click(), "#6 of 8")  # skip it
        act(press("2"), "#7 of 8")  # item 5: key 2
        wait.until(lambda d: d.find_element(By.ID, "counts").text == "5 / 8 labelled, 1 skipped")
        assert "labels/min" in browser.find_element(By.ID, "rate").text
        screenshot = tmp_path / "labelling.png"
        assert browser.save_screenshot(str(screenshot))
        assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if os.environ.get("LMHP_UPDATE_SCREENSHOT") == "1":
            shutil.copyfile(screenshot, ROOT / "docs" / "labelling.png")
        # nothing came from anywhere but the server: the page is self-contained
        origins = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert all(name.startswith(url) for name in origins)
        # killed, and started again at once by the same command: the same port (its connections in TIME-WAIT)
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        proc, again, _ = start_server(cache, out, port=None)
        assert again == url
        browser.refresh()
        wait.until(lambda d: shown() == "#7 of 8")
        # a click that names another item than the server's at its index (a page shown before a resume): refused (409),
        # nothing kept, and the page reloads (its script state gone) to show the server's item
        browser.execute_script("window.stale = true; state.item.request = 'an item of another session'")
        browser.find_element(By.ID, "sample0").click()
        page_wait(browser, 60).until(  # a reload, not a model: 60 s on a loaded machine
            lambda d: d.execute_script("return window.stale === undefined && state && state.item !== null"))
        assert shown() == "#7 of 8"
        act(press("4"), "#8 of 8")  # item 6: key 4
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    records = read_labels(out)  # OpenAI's schema, as --labels.source reads it
    items = journal_items(out)
    chosen = {0: 1, 1: 2, 2: 0, 3: 3, 5: 1, 6: 3}
    assert [r["best"] for r in records] == list(chosen.values())
    assert [r["query"] for r in records] == [items[i]["query"] for i in chosen]
    assert [[r[f"sample{j}"] for j in range(4)] for r in records] == [items[i]["samples"] for i in chosen]

    run = tmp_path / "reward"
    env = differing(label_env(cache))
    result = in_process("train_reward.py", "--task", "offline", "--labels.source", out, "--labels.num-train", 4,
                        "--batch-size", 4, "--eval-labels", 1, "--num-ranks", 4, "--rollout-batch-size", 8,
                        "--normalize-samples", 8, "--device", "cpu", "--output-dir", run, cwd=tmp_path, env_extra=env)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_reward/minibatch/loss"] for r in rows if "train_reward/minibatch/loss" in r]
    assert len(losses) == 1 and 0 < losses[0] < 10
    assert "held-out accuracy on 1 labels" in result.stdout
    assert (run / "reward_model" / "config.json").is_file()


def test_two_labellers_label_the_same_items_and_their_agreement_is_printed(assets, tmp_path, two_browsers, capsys):
    """--labels-per-item 2 on the first 3 of 8 items (--repeat-share 0.375): ann and bob, each in a browser of their
    own, are both shown items 1-3; the label file holds both labels with their names, and the agreement command
    prints the figures worked out by hand."""
    from selenium.webdriver.common.by import By

    cache = tiny_offline_cache(tmp_path / "cache", assets)
    out = tmp_path / "labels.json"
    proc, url, _ = start_server(cache, out, "--labels-per-item", "2", "--repeat-share", "0.375")
    choices = {"ann": [0, 1, 2], "bob": [0, 2, 2]}  # of items 1, 2 and 3
    try:
        for browser in two_browsers:
            browser.get(url)
        for browser, (name, chosen) in zip(two_browsers, choices.items()):
            give_name(browser, name)
            wait = page_wait(browser)
            shown = lambda: browser.find_element(By.ID, "index").get_attribute("textContent")  # noqa: E731
            for k, best in enumerate(chosen):
                wait.until(lambda d: shown() == f"#{k + 1} of 8")
                browser.find_element(By.ID, f"sample{best}").click()
            # ann's tab holds item 4, the next to label, which wants one label: bob is shown item 5
            wait.until(lambda d: shown() == {"ann": "#4 of 8", "bob": "#5 of 8"}[name])
        assert two_browsers[1].find_element(By.ID, "counts").text == "6 / 11 labels, 3 yours"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    records = read_labels(out)  # OpenAI's schema, as --labels.source reads it
    assert [r["labels"] for r in records] == [[{"labeller": "ann", "best": a}, {"labeller": "bob", "best": b}]
                                              for a, b in zip(choices["ann"], choices["bob"])]
    assert [(r["labeller"], r["best"]) for r in records] == [("ann", 0), ("ann", 1), ("ann", 2)]  # the first trains
    agreement.main([str(out)])
    printed = capsys.readouterr().out.splitlines()
    # ann & bob agree on items 1 and 3: 2 of 3 (66.7%), the one pair of labels per item
    # kappa: n_ij = [2,0,0,0], [0,1,1,0], [0,0,2,0]; P_i = 1, 0, 1; P_bar = 2/3; p_j = [2, 1, 3, 0] / 6;
    #   P_e = (4 + 1 + 9) / 36 = 7/18; kappa = (2/3 - 7/18) / (11/18) = 5/11 = 0.455
    assert "  ann & bob      3      2  66.7%" in printed
    assert "overall: 2 of 3 pairs of labels agree, 66.7% (chance 25.0%)" in printed
    assert "Fleiss' kappa (4 choices, 3 items): 0.455 (P_bar 0.667, P_e 0.389; 0 is chance, 1 full agreement)" in printed
