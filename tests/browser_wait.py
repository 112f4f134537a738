"""Waiting in the browser tests: on conditions the page shows, never on time.

Every wait names what it waited for; when it times out, a screenshot of the page is saved under
artifacts/screenshots/failed_<what>.png and the test fails with that name and the file. "The run
this action caused has finished" is read from the server's own messages on the page's websocket
(a ForwardMsg script_finished), so it is a condition, not a pause, however slowly the browser
draws; "no run in progress" from the app root's `data-test-script-state` attribute.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
APP_ROOT = '[data-testid="stApp"]'
_SESSIONS: list = []  # CDP sessions holding a page's CPU throttling
_SOCKETS: dict = {}  # page -> its Streamlit websocket (the latest one)

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
    """Follow this page's Streamlit websocket (call once, before the first goto). With
    POP_LAB_BROWSER_SLOWDOWN=N the page's CPU runs N times slower (Chrome's own throttling), as
    on a slow or busy machine: the waits must hold there too."""
    page.on("websocket", lambda ws: _SOCKETS.__setitem__(page, ws) if "_stcore/stream" in ws.url
            else None)
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


def choose(page, open_menu, option, what: str, tries: int = 3) -> None:
    """Click `option` in a menu that `open_menu()` opens; the menu is opened again when it has
    closed meanwhile (a redraw of the widget closes it), each try waiting for the option."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(tries):
        if not option.is_visible():
            open_menu()
        try:
            option.click(timeout=10_000)
            return
        except PlaywrightTimeout:
            continue
    fail_with_shot(page, what, f"{tries} tries")


def _run_finished(payload) -> bool:
    """Whether a websocket frame is the server's 'script finished' for a whole-page run."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    if not isinstance(payload, (bytes, bytearray)):
        return False
    try:
        msg = ForwardMsg.FromString(bytes(payload))
    except Exception:  # noqa: BLE001 - not a ForwardMsg: not the end of a run
        return False
    done = (ForwardMsg.FINISHED_SUCCESSFULLY, ForwardMsg.FINISHED_WITH_COMPILE_ERROR)
    return msg.WhichOneof("type") == "script_finished" and msg.script_finished in done


def idle(page, timeout_s: float = 300) -> None:
    """Wait until no script run is in progress."""
    wait_for(page, "the app to finish its run", IDLE, timeout_s=timeout_s)


def rerun(page, action, what: str, timeout_s: float = 300) -> None:
    """Do `action()` (a click, a keypress that changes a widget) once no run is in progress, then
    wait for the server to say the run it caused has finished, and for the page to settle."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    idle(page, timeout_s)
    socket = _SOCKETS.get(page)
    if socket is None:
        fail_with_shot(page, f"the page's websocket before {what}")
    try:
        with socket.expect_event("framereceived", predicate=_run_finished,
                                 timeout=timeout_s * 1000):
            action()
    except PlaywrightTimeout as e:
        fail_with_shot(page, f"the run after {what}", str(e).splitlines()[0])
    idle(page, timeout_s)


def centre(page, selector: str, index: int, what: str, timeout_s: float = 60) -> dict:
    """The viewport centre (x, y) and box of the index-th element of `selector`, once laid out."""
    return wait_for(page, what, CENTRE, [selector, index], timeout_s)


# ---------- the server and the browser (fixtures in tests/browser/conftest.py) ----------

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PLOT = ".js-plotly-plot"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("streamlit did not become healthy")


def shot(page, name: str) -> None:
    """The whole page: the window is made as tall as the app's scrolling main area first."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    tall = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]')?.scrollHeight || 0")
    height = min(max(tall, size["height"]), 6000)
    page.set_viewport_size({"width": size["width"], "height": height})
    wait_for(page, f"the window to be {height} px tall for {name}", "h => window.innerHeight === h",
             height)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    page.set_viewport_size(size)


def open_page(page, title: str, heading: str) -> float:
    """Click the sidebar link and wait for the page heading; returns seconds taken."""
    t0 = time.time()
    link = page.locator('[data-testid="stSidebarNav"]').get_by_text(title, exact=True)
    rerun(page, link.click, f"opening the {title} page")
    visible(page, page.get_by_role("heading", name=re.compile(heading)).first,
            f"the heading of the {title} page", timeout_s=300)  # a first visit imports the
    # page's modules: over a minute on a machine busy starting engines (seen on the Serve page)
    idle(page)
    return time.time() - t0


def set_number(page, label: str, value: int) -> None:
    box = page.get_by_label(label, exact=True)
    visible(page, box, f"the {label} box")
    box.fill(str(value))
    rerun(page, lambda: box.press("Enter"), f"setting {label} to {value}")


