"""Waiting in the browser tests: on conditions the page shows, never on time.

Every wait names what it waited for; when it times out, a screenshot of the page is saved under
artifacts/screenshots/failed_<what>.png and the test fails with that name and the file. A script
run is seen through the `data-test-script-state` attribute Streamlit's app root carries: an
observer installed before the page's own scripts counts the runs that start, so "the run this
action caused has finished" is a condition, not a pause.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
APP_ROOT = '[data-testid="stApp"]'
_SESSIONS: list = []  # CDP sessions holding a page's CPU throttling

# Counts script runs as they start (the attribute turns "running"); installed on every document.
RUN_COUNTER = """
window.__popRuns = 0;
new MutationObserver(records => {
  for (const r of records) {
    if (r.target.getAttribute('data-test-script-state') === 'running' && r.oldValue !== 'running')
      window.__popRuns += 1;
  }
}).observe(document, {subtree: true, attributes: true, attributeOldValue: true,
                      attributeFilter: ['data-test-script-state']});
"""

IDLE = f"""() => {{
  const app = document.querySelector('{APP_ROOT}');
  return !!app && app.getAttribute('data-test-script-state') === 'notRunning';
}}"""

# The centre of the i-th element matching a selector, once it is laid out (width and height > 0),
# read in one step so a chart redrawn meanwhile cannot hand back a stale box.
CENTRE = """([selector, i]) => {
  const el = document.querySelectorAll(selector)[i];
  if (!el || !el.isConnected) return null;
  const r = el.getBoundingClientRect();
  return r.width > 0 && r.height > 0 ? {x: r.x + r.width / 2, y: r.y + r.height / 2,
                                        left: r.left, top: r.top, right: r.right,
                                        bottom: r.bottom} : null;
}"""


def install(page) -> None:
    """Count script runs on this page (call once, before the first goto). With
    POP_LAB_BROWSER_SLOWDOWN=N the page's CPU runs N times slower (Chrome's own throttling), as
    on a slow or busy machine: the waits must hold there too."""
    page.add_init_script(RUN_COUNTER)
    rate = float(os.environ.get("POP_LAB_BROWSER_SLOWDOWN") or 1)
    if rate > 1:
        session = page.context.new_cdp_session(page)
        session.send("Emulation.setCPUThrottlingRate", {"rate": rate})
        _SESSIONS.append(session)  # the throttling lasts while its session stays attached


def fail_with_shot(page, what: str, detail: str = "") -> None:
    """Save the page as it stands and fail the test, naming what was awaited."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"failed_{re.sub(r'[^A-Za-z0-9]+', '_', what).strip('_')[:60]}.png"
    try:
        page.screenshot(path=str(path), full_page=True)
        saved = f"; screenshot {path}"
    except Exception as e:  # noqa: BLE001 - a dead page still fails the test with its reason
        saved = f"; no screenshot ({type(e).__name__})"
    pytest.fail(f"timed out waiting for {what}{saved}{': ' + detail if detail else ''}",
                pytrace=False)


def wait_for(page, what: str, condition, arg=None, timeout_s: float = 60):
    """Wait until the JS `condition(arg)` is truthy; returns its value (JSON)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        return page.wait_for_function(condition, arg=arg, timeout=timeout_s * 1000,
                                      polling=100).json_value()
    except PlaywrightTimeout:
        fail_with_shot(page, what)


def visible(page, locator, what: str, timeout_s: float = 60) -> None:
    """Wait until `locator` (a text, a heading, a chart) is shown."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        locator.wait_for(state="visible", timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        fail_with_shot(page, what)


def gone(page, locator, what: str, timeout_s: float = 60) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        locator.wait_for(state="hidden", timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        fail_with_shot(page, what)


def until_shown(page, action, locator, what: str, tries: int = 3, each_s: float = 10) -> None:
    """Do `action()` until `locator` shows (a menu opened by a click that a redraw of the page
    can swallow): each try waits for the effect, not for time."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(tries):
        action()
        try:
            locator.wait_for(state="visible", timeout=each_s * 1000)
            return
        except PlaywrightTimeout:
            continue
    fail_with_shot(page, what, f"{tries} tries")


def runs(page) -> int:
    """Script runs started on this page so far."""
    return page.evaluate("() => window.__popRuns || 0")


def idle(page, timeout_s: float = 300) -> None:
    """Wait until no script run is in progress."""
    wait_for(page, "the app to finish its run", IDLE, timeout_s=timeout_s)


def rerun(page, action, what: str, timeout_s: float = 300) -> None:
    """Do `action()` (a click, a keypress that changes a widget), then wait until the script run
    it caused has started and finished."""
    before = runs(page)
    action()
    wait_for(page, f"the run after {what}",
             f"() => (window.__popRuns || 0) > {before} && ({IDLE})()", timeout_s=timeout_s)


def centre(page, selector: str, index: int, what: str, timeout_s: float = 60) -> dict:
    """The viewport centre (x, y) and box of the index-th element of `selector`, once laid out."""
    return wait_for(page, what, CENTRE, [selector, index], timeout_s)
