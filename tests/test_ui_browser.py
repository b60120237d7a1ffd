"""cpersona ui in a real headless Chromium: the real ``cpersona ui`` process, a seeded SQLite file, every page.

Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them)
are driven by Selenium through ``/usr/bin/chromedriver``; nothing is
downloaded. A screenshot of every page is written under
``test-artifacts/ui/`` (ignored by git; CPERSONA_TEST_ARTIFACTS moves it).
"""

from __future__ import annotations

import base64
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cpersona.config import load_settings
from cpersona.services.app import App
from test_ui import HOSTILE, seed

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("CPERSONA_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "ui"
WAIT = 30  # seconds: generous bounds for a loaded machine, never a timing assertion

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="Debian's chromium and chromium-driver are not installed (apt-get install -y chromium chromium-driver; "
    ".ci/run installs them)",
)


class UiProcess:
    """``cpersona ui`` started as a user starts it; the URL is read from its first stdout line."""

    def __init__(self, db_path: Path, *extra: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CPERSONA_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cpersona", "ui", "--db", str(db_path), "--port", "0", *extra],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.proc.stdout], daemon=True).start()
        try:
            line = lines.get(timeout=WAIT)
        except queue.Empty:
            self.stop()
            raise AssertionError(f"cpersona ui printed no URL: {self.proc.stderr.read()}") from None
        assert line.startswith("cpersona ui: http://127.0.0.1:"), line
        self.url = line.split(": ", 1)[1].strip()
        self.base = self.url.split("/?token=")[0]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def seeded(db) -> tuple[Path, dict[str, int]]:
    app = App(db=db, settings=load_settings({"CPERSONA_DB_PATH": str(db.path)}))
    return db.path, seed(app)


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="cpersona-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def shot(driver, name: str) -> Path:
    """A screenshot of the whole page, beyond the window's height (Chromium's DevTools capture)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    answer = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    path.write_bytes(base64.b64decode(answer["data"]))
    return path


def no_alert(driver) -> bool:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        driver.switch_to.alert  # noqa: B018 — reading it raises when no alert is open
    except NoAlertPresentException:
        return True
    return False


def wait_for(driver, condition) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # A page that re-renders between find_element and .text leaves a stale handle:
    # that is the page changing, not the condition failing, so look again.
    WebDriverWait(driver, WAIT, ignored_exceptions=(StaleElementReferenceException,)).until(condition)


def test_every_page_in_chromium_read_only(seeded, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    db_path, ids = seeded
    ui = UiProcess(db_path)
    driver = browser
    try:
        # Without the token nothing is served; with it, the token leaves the address bar.
        driver.get(ui.base + "/timeline")
        assert "401" in driver.find_element(By.TAG_NAME, "body").text
        driver.get(ui.url)
        assert "token=" not in driver.current_url and driver.title.startswith("Search")
        shots = [shot(driver, "01-search-empty")]

        # Search: the real recall answer, best first, with its match_reason and notices.
        Select(driver.find_element(By.NAME, "agent")).select_by_visible_text("alice")
        box = driver.find_element(By.NAME, "q")
        box.send_keys("deploy window")
        box.submit()
        wait_for(driver, lambda d: "q=deploy" in d.current_url)
        hits = driver.find_elements(By.CSS_SELECTOR, "li.hit")
        assert hits and "The deploy window is Friday noon" in hits[0].text
        assert "match_reason" in hits[0].text
        assert "advisory" in driver.find_element(By.CSS_SELECTOR, "div.notices").text
        shots.append(shot(driver, "02-search-results"))

        # The hostile memory is shown as text, never run.
        driver.get(ui.base + "/?q=MizEye&agent=alice")
        assert no_alert(driver) and driver.title != "pwned"
        assert HOSTILE in driver.find_element(By.TAG_NAME, "main").text
        assert not driver.find_elements(By.CSS_SELECTOR, "main script, main img")

        # Timeline: every row, then a filter chosen in the form narrows it.
        driver.get(ui.base + "/timeline")
        assert len(driver.find_elements(By.CSS_SELECTOR, "table.timeline tbody tr")) == 5
        assert "<i>eve</i>" in driver.find_element(By.CSS_SELECTOR, "table.timeline").text
        shots.append(shot(driver, "03-timeline"))
        Select(driver.find_element(By.NAME, "channel")).select_by_visible_text("dev")  # the page submits on change
        wait_for(driver, lambda d: "channel=dev" in d.current_url)
        rows = driver.find_elements(By.CSS_SELECTOR, "table.timeline tbody tr")
        assert len(rows) == 1 and "Kirari keeps MizEye" in rows[0].text
        assert no_alert(driver) and driver.title != "pwned"
        shots.append(shot(driver, "04-timeline-filtered"))
        driver.find_element(By.LINK_TEXT, "stored today").click()
        wait_for(driver, lambda d: "since=" in d.current_url)
        assert len(driver.find_elements(By.CSS_SELECTOR, "table.timeline tbody tr")) == 5

        # One record; read-only offers no change and refuses one forced on it.
        driver.get(f"{ui.base}/record/mem/{ids['hostile']}")
        main = driver.find_element(By.TAG_NAME, "main").text
        assert HOSTILE in main and "maintains" in main and "Recall history" in main
        assert not driver.find_elements(By.XPATH, "//button[text()='Save edit']")
        shots.append(shot(driver, "05-record"))
        driver.get(f"{ui.base}/record/mem/{ids['plain']}")
        assert "0–10" in driver.find_element(By.TAG_NAME, "main").text  # its range
        driver.execute_script(
            "const f = document.createElement('form'); f.method = 'post'; f.action = arguments[0];"
            "document.body.appendChild(f); f.submit();",
            f"/record/mem/{ids['plain']}/delete",
        )
        wait_for(driver, lambda d: d.title.startswith("Read-only"))
        assert "cpersona ui --write" in driver.find_element(By.TAG_NAME, "main").text
        shots.append(shot(driver, "06-write-refused"))
        driver.get(f"{ui.base}/record/mem/{ids['plain']}")
        assert "Friday noon" in driver.find_element(By.TAG_NAME, "main").text  # still there

        for path, name, expect in (
            ("/profile?agent=alice", "07-profile", "Alice, engineer"),
            ("/graph?agent=alice&entity=MizEye", "08-graph", "maintains"),
            ("/health", "09-health", "null_embedding"),
            ("/stats", "10-charts", "database size"),
        ):
            driver.get(ui.base + path)
            assert expect in driver.find_element(By.TAG_NAME, "main").text, path
            assert no_alert(driver) and driver.title != "pwned"
            shots.append(shot(driver, name))
        driver.get(ui.base + "/graph?agent=alice&entity=MizEye")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#graph .node")) == 5  # two hops out from MizEye
        assert driver.find_element(By.CSS_SELECTOR, "#graph").size["width"] > 300  # drawn, not a table
        assert all(p.stat().st_size > 5000 for p in shots)
    finally:
        ui.stop()


def test_write_actions_work_with_write_in_chromium(seeded, browser):
    from selenium.webdriver.common.by import By

    db_path, ids = seeded
    ui = UiProcess(db_path, "--write")
    driver = browser
    try:
        driver.get(ui.url)
        record = f"{ui.base}/record/mem/{ids['plain']}"
        driver.get(record)
        shot(driver, "11-record-with-write")
        driver.find_element(By.XPATH, "//button[text()='Lock']").click()
        wait_for(driver, lambda d: "lock_memory: done" in d.find_element(By.TAG_NAME, "main").text)
        driver.get(record)
        driver.find_element(By.LINK_TEXT, "Delete…").click()
        wait_for(driver, lambda d: d.title.startswith("Confirm delete"))
        shot(driver, "12-confirm-delete")
        driver.find_element(By.XPATH, "//button[text()='Yes, delete it']").click()
        wait_for(driver, lambda d: "delete_memory: not done" in d.find_element(By.TAG_NAME, "main").text)
        assert "locked" in driver.find_element(By.TAG_NAME, "main").text  # the lock holds, as for an agent
        shot(driver, "13-delete-refused-locked")
        driver.get(record)
        driver.find_element(By.XPATH, "//button[text()='Unlock']").click()
        wait_for(driver, lambda d: "unlock_memory: done" in d.find_element(By.TAG_NAME, "main").text)
        driver.get(record)
        area = driver.find_element(By.NAME, "content")
        area.clear()
        area.send_keys("The deploy window moved to Monday")
        driver.find_element(By.XPATH, "//button[text()='Save edit']").click()
        wait_for(driver, lambda d: "update_memory: done" in d.find_element(By.TAG_NAME, "main").text)
        driver.get(record + "/delete")
        driver.find_element(By.XPATH, "//button[text()='Yes, delete it']").click()
        wait_for(driver, lambda d: "delete_memory: done" in d.find_element(By.TAG_NAME, "main").text)
        driver.get(record)
        assert driver.title.startswith("Not found")
        driver.get(f"{ui.base}/timeline?agent=alice")
        assert "Monday" not in driver.find_element(By.TAG_NAME, "main").text
    finally:
        ui.stop()
