"""The status page in a real browser: Debian's Chromium, headless, driven by Playwright,
against `bisect-cli serve --runners 1` bisecting the bundled example.

Submits the example, watches the strip fill in live (SSE, no reload), clicks the first-bad
cell and sees its curves drawn, copies the Markdown, cancels a second job through the
button and its confirmation page, and checks the console stayed free of errors (a CSP
violation is one). Screenshots go to $WEB_SCREENSHOTS_DIR (default: the test's temporary
directory); `WEB_SCREENSHOTS_DIR=docs uv run pytest tests/test_web_browser.py` refreshes
the README's docs/web-*.png.

Chromium missing: skipped on a developer machine, a failure when CI=true (.ci/run installs
it with apt).
"""

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.models import JobStatus
from tests.test_cli_service import REPRO
from tests.web_support import HOSTILE_LOG, HOSTILE_REQ, add_job, service_env, serving

pytestmark = pytest.mark.browser
CHROMIUM = os.environ.get("LEAKBISECT_CHROMIUM", "/usr/bin/chromium")
FINAL = {
    "1.0.0": "C",
    "1.0.1": "·",
    "1.0.2": "·",
    "1.0.3": "·",
    "1.0.4": "×",
    "1.0.5": "C",
    "1.0.6": "L",
    "1.0.7": "L",
    "1.0.8": "·",
    "1.0.9": "L",
}


@pytest.fixture(scope="module")
def chromium() -> str:
    if shutil.which(CHROMIUM) is None:
        message = f"{CHROMIUM} not found: apt-get install chromium (.ci/run does)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, reachable_dir: Any, uv_cache: Path
) -> Iterator[tuple[str, str]]:
    home = tmp_path_factory.mktemp("web-browser")
    env = service_env(home, reachable_dir, uv_cache)
    url = f"sqlite:///{home / 'browser.db'}"
    with serving(home, env, url, "--runners", "1") as svc:
        yield svc.url, url


def shots_dir(tmp_path: Path) -> Path:
    target = Path(os.environ.get("WEB_SCREENSHOTS_DIR") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    return target


def submit(base: str, index: str, reuse: bool = True) -> int:
    body = {
        "package": "leakyfixture",
        "range": "1.0.0..1.0.9",
        "script": REPRO.read_text(),
        "index_url": index,
        "reuse_verdicts": reuse,
    }
    r = httpx.post(f"{base}/api/v1/jobs", json=body, timeout=60)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def strip_letters(page: Any) -> dict[str, str]:
    cells = page.query_selector_all("#strip a.cell")
    return {c.get_attribute("data-version"): c.get_attribute("data-letter") for c in cells}


def test_watch_a_bisection_live(
    chromium: str, server: tuple[str, str], fixture_index: str, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    server, db_url = server
    shots = shots_dir(tmp_path)
    errors: list[str] = []
    job = submit(server, fixture_index)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server)
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{server}/jobs/{job}")
        # Marks that survive only while the page is not reloaded, and counts SSE messages.
        page.evaluate(
            "window.__same_page = 'yes'; window.__sse = 0;"
            "document.body.addEventListener('htmx:sseMessage', () => window.__sse++)"
        )
        seen = [strip_letters(page)]
        page.click('summary:text-is("Markdown")')  # opened by the reader: stays open
        took_running = False
        deadline = time.monotonic() + 240
        while page.get_attribute("#job-live", "data-status") != "found":
            assert time.monotonic() < deadline, f"not found in time; strips seen: {seen}"
            letters = strip_letters(page)
            if letters != seen[-1]:
                seen.append(letters)
            if not took_running and "▶" in letters.values():
                page.screenshot(path=str(shots / "web-job-running.png"), full_page=True)
                took_running = True
            page.wait_for_timeout(250)
        seen.append(strip_letters(page))
        assert page.evaluate("window.__same_page") == "yes"  # filled in without a reload
        assert page.evaluate("window.__sse") > 0
        assert page.get_attribute("#markdown-details", "open") is not None
        assert seen[-1] == FINAL and len(seen) >= 3, seen
        assert took_running
        assert page.inner_text("#answer") == "first bad 1.0.6, last good 1.0.5, confirmed twice"

        check_a_late_refresh_never_undoes_a_click(page)
        page.click("a.cell[data-version='1.0.6']")
        page.wait_for_selector("#candidate h2:has-text('Release 1.0.6')")
        assert page.url == f"{server}/jobs/{job}?candidate=1.0.6"
        # Each curve is fetched on its own: wait for the second as well.
        page.locator(".curve[data-drawn=done] canvas").nth(1).wait_for()
        drawn = page.query_selector_all(".curve[data-drawn=done]")
        assert len(drawn) == 2 and all(d.query_selector("canvas") for d in drawn)
        assert "samples drawn" in drawn[0].inner_text()

        page.click("#copy-md")
        page.wait_for_selector("#copy-md:has-text('Copied')")
        copied = page.evaluate("navigator.clipboard.readText()")
        assert copied.splitlines()[:3] == [
            "### leakbisect: `leakyfixture` 1.0.0..1.0.9",
            "",
            "**first bad 1.0.6, last good 1.0.5, confirmed twice**",
        ]
        assert copied == httpx.get(f"{server}/api/v1/jobs/{job}/report.md").text
        page.screenshot(path=str(shots / "web-job.png"), full_page=True)

        second = submit(server, fixture_index, reuse=False)  # else it is answered at once
        page.goto(f"{server}/jobs/{second}")
        page.click("#cancel")
        page.wait_for_selector("#confirm-cancel")
        page.click("#confirm-cancel")
        page.wait_for_selector("#job-live[data-status=cancelled]")
        assert page.inner_text("#answer") == "cancelled: cancelled from the status page"
        assert page.query_selector("#cancel") is None

        page.goto(f"{server}/")
        page.wait_for_selector(f"#job-row-{second}")
        assert page.inner_text(f"#job-row-{job} .result") == "1.0.5 → 1.0.6"
        page.screenshot(path=str(shots / "web-list.png"), full_page=True)
        phone = browser.new_context(
            viewport={"width": 390, "height": 844}, color_scheme="dark"
        ).new_page()
        phone.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        phone.goto(f"{server}/jobs/{job}")
        phone.wait_for_selector(".curve[data-drawn=done] canvas")
        phone.screenshot(path=str(shots / "web-job-phone.png"), full_page=False)
        check_without_javascript(browser, server, job)
        check_hostile_output(browser, server, db_url, errors)
        browser.close()
    assert errors == []


def check_without_javascript(browser: Any, server: str, job: int) -> None:
    """The same page, static: the answer, the strip, the Markdown; no copy button."""
    page = browser.new_context(java_script_enabled=False).new_page()
    page.goto(f"{server}/jobs/{job}")
    assert page.inner_text("#answer") == "first bad 1.0.6, last good 1.0.5, confirmed twice"
    assert strip_letters(page) == FINAL
    assert not page.is_visible("#copy-md")
    page.click('summary:text-is("Markdown")')
    assert page.input_value("#markdown").startswith("### leakbisect: `leakyfixture`")
    page.click("a.cell[data-version='1.0.0']")  # a plain link without JavaScript
    assert page.url == f"{server}/jobs/{job}?candidate=1.0.0"
    assert page.inner_text("#candidate h2") == "Release 1.0.0: clean"


def check_a_late_refresh_never_undoes_a_click(page: Any) -> None:
    """The panel's own refresh (as on SSE "changed", for the release it shows) is held in
    flight while the reader clicks 1.0.9; when it answers it is not swapped in, and nothing
    was aborted (htmx logs an aborted request to the console as an error)."""
    assert "candidate=1.0.9" not in page.get_attribute("#job-live", "hx-get")
    held: list[Any] = []

    def hold(route: Any) -> None:
        if "candidate=1.0.9" in route.request.url or held:
            route.continue_()
        else:
            held.append(route)

    page.route("**/fragments/live*", hold)
    # What a "changed" message does: the panel fetches its own hx-get into itself.
    page.evaluate(  # not awaited: its promise settles only once the held answer is in
        "() => { htmx.ajax('GET', document.getElementById('job-live').getAttribute('hx-get'),"
        " {source: '#job-live', target: '#job-live', swap: 'outerHTML'}); }"
    )
    deadline = time.monotonic() + 30
    while not held:
        assert time.monotonic() < deadline, "the refresh was never sent"
        page.wait_for_timeout(50)
    page.click("a.cell[data-version='1.0.9']")
    page.wait_for_selector("#candidate h2:has-text('Release 1.0.9')")
    with page.expect_response(held[0].request.url):
        held[0].continue_()
    page.wait_for_timeout(500)  # the late answer's handlers have run
    assert "Release 1.0.9" in page.inner_text("#candidate h2")
    page.unroute("**/fragments/live*")


def check_hostile_output(browser: Any, server: str, db_url: str, errors: list[str]) -> None:
    """A script that printed <script>alert(1)</script> and a requirement with an onerror
    handler: shown as text, nothing runs (no dialog opens)."""
    job = add_job(
        db_url,
        JobStatus.FOUND,
        verdicts={"1.0": "clean", "1.3": "leak"},
        log_tail=HOSTILE_LOG,
        requirements=[HOSTILE_REQ],
        result={"status": "found", "last_old": "1.0", "first_new": "1.3", "skipped": []},
    )
    dialogs: list[str] = []
    page = browser.new_page()
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{server}/jobs/{job}?candidate=1.3")
    page.click("text=Log tail")
    assert "<script>alert(1)</script>" in page.inner_text("pre.log-tail")
    assert HOSTILE_REQ in page.inner_text("dl.args")
    assert page.query_selector("img") is None and dialogs == []
