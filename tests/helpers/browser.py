"""Debian's headless Chromium and its WebDriver, found once."""

from __future__ import annotations

import os
import shutil

import pytest


def browser_paths() -> tuple[str, str]:
    """Chromium and its WebDriver; a skip (outside CI) or a failure (CI=true) naming the fix when either is missing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    reason = "no chromium/chromedriver found: apt-get install chromium chromium-driver to run the browser test"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def chrome():
    """A headless Chromium session of its own (its own profile: its own localStorage, as another person's browser)."""
    chromium, driver_path = browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,760",
                 "--proxy-server=direct://", "--disable-background-networking", "--lang=en-US"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver_path), options=options)


WAIT_S = 120  # a bound on each wait for the page to change (a loaded 2-core machine)
POLL_S = 0.05  # how often a wait looks at the page again: selenium's 0.5 s left each click's answer unseen ~0.4 s


def page_wait(driver, seconds: float = WAIT_S):
    """selenium's WebDriverWait on ``driver`` for up to ``seconds``, looking again every POLL_S."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, seconds, poll_frequency=POLL_S)


def give_name(browser, name: str) -> None:
    """Answer the page's question for the labeller's name, as a person types it."""
    from selenium.webdriver.common.by import By

    field = page_wait(browser).until(lambda d: d.find_element(By.ID, "nameinput"))
    page_wait(browser).until(lambda d: field.is_displayed())
    field.send_keys(name)
    browser.find_element(By.ID, "namego").click()


@pytest.fixture()
def browser():
    driver = chrome()
    yield driver
    driver.quit()


@pytest.fixture()
def two_browsers():
    """Two browsers, as two labellers on two machines would have."""
    first = chrome()
    try:
        second = chrome()
    except BaseException:
        first.quit()
        raise
    yield first, second
    first.quit()
    second.quit()
