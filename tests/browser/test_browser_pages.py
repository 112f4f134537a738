"""The dashboard in a real browser: `streamlit run dashboard/app.py` on a free localhost port,
driven by Playwright through Debian's headless chromium (never a downloaded browser).

Visits every page through the sidebar navigation (one session): two small calibrations, one
overlaid on the other, a CSV download, a preset, single clicks and a box on the layer strip (the
sidebar must follow each), a generation; checks plotly charts are drawn, and saves screenshots
and timings under artifacts/screenshots/. The server is stopped by its pid.

Every step waits on what it acts on (browser_wait): a chart's points laid out before a click, the
run an action caused finished, a text shown; a wait that times out saves a screenshot named after
what it waited for.
"""
import json
import os
import re
import time
from pathlib import Path

from browser_wait import (
    PLOT,
    SHOTS,
    centre,
    choose,
    gone,
    idle,
    open_page,
    rerun,
    set_number,
    shot,
    visible,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
LOAD_AT_START = os.getloadavg()[0] / (os.cpu_count() or 1)  # other work on the machine


# The progress bar's text when it differs from the last one seen, or done=true once the page
# shows `pattern` (the run's closing note).
PROGRESS = """([last, pattern]) => {
  const bar = document.querySelector('[data-testid="stProgress"]');
  const text = bar ? bar.innerText : null;
  if (new RegExp(pattern).test(document.body.innerText)) return {done: true, text};
  return text && text !== last ? {done: false, text} : null;
}"""


def watch_progress(page, pattern: str, timeout: float = 300) -> list[float]:
    """Every change of the progress bar's text until `pattern` shows; the times they came."""
    changes, last, end = [], None, time.time() + timeout
    while True:
        seen = wait_for(page, f"the progress bar to move or /{pattern}/ to show", PROGRESS,
                        [last, pattern], timeout_s=max(1.0, end - time.time()))
        if seen["done"]:
            return changes
        changes.append(time.time())
        last = seen["text"]


def loads(page) -> int:
    text = page.locator('[data-testid="stSidebar"]').inner_text()
    return int(re.search(r"loads in this server: (\d+)", text).group(1))


SQUARES = f"{PLOT} .scatterlayer .point"  # the layer strip's squares (the page's first chart)


def click_square(page, layer: int) -> None:
    """One click on a square of the layer strip, once the strip's points are laid out."""
    at = centre(page, SQUARES, layer, f"square {layer} of the layer strip to be laid out")
    rerun(page, lambda: page.mouse.click(at["x"], at["y"]), f"a click on square {layer}")


def test_every_page_in_a_real_browser(server, browser_page):
    page = browser_page
    perf = {}
    t_connect = time.time()
    page.goto(server["url"])
    visible(page, page.locator(PLOT).first, "the first page's chart", timeout_s=120)
    perf["first_page_interactive_s"] = round(time.time() - server["t_launch"], 2)
    perf["server_ready_s"] = round(server["t_healthy"] - server["t_launch"], 2)
    perf["first_page_after_connect_s"] = round(time.time() - t_connect, 2)  # before the model
    visible(page, page.get_by_text(re.compile(r"loads in this server: 1")), "the model, loaded",
            timeout_s=300)  # it loads in the background, after the first page's chart
    perf["model_loaded_after_connect_s"] = round(time.time() - t_connect, 2)
    idle(page)
    assert "Skip set:" in page.locator('[data-testid="stSidebar"]').inner_text()
    assert loads(page) == 1
    shot(page, "1_overview")

    # Calibrate: two small runs (the second is overlaid on the first), then one from the store.
    perf["switch_to_calibrate_s"] = round(open_page(page, "Calibrate", "Calibrate"), 2)
    set_number(page, "Samples", 2)
    set_number(page, "Response tokens", 8)
    t0 = time.time()
    page.get_by_role("button", name="Run calibration").click()
    note = "Calibration of .*stored for next time"
    done = page.get_by_text(re.compile(note))
    changes = watch_progress(page, note)
    perf["calibration_s"] = round(time.time() - t0, 2)
    gaps = [b - a for a, b in zip(changes, changes[1:])]
    perf["progress_bar_redraws"] = len(changes)
    perf["progress_bar_longest_gap_s"] = round(max(gaps), 2) if gaps else None
    assert len(changes) >= 2, "the progress bar was never seen moving"
    # A frozen bar, not a slow machine, is what this guards against (it redraws every second; a
    # bar drawn only at the start and the end stands still for most of the run): 5 s, or a third
    # of the run where a busy machine stretches the run itself.
    limit = max(5.0, perf["calibration_s"] / 3)
    assert max(gaps) <= limit, f"the progress bar stood still for {max(gaps):.1f} s of " \
                               f"{perf['calibration_s']:.0f} s"
    idle(page)
    visible(page, page.locator(PLOT).first, "the importance chart")
    set_number(page, "Seed", 1)
    page.get_by_role("button", name="Run calibration").click()
    gone(page, done, "the first run's note to go as the second run starts")
    visible(page, done, "the second calibration's note", timeout_s=300)
    idle(page)
    listing = page.get_by_text(re.compile(r"Stored calibrations \(2\)"))
    toggle = page.get_by_text("95% interval bands")
    end = time.time() + 60
    while not listing.count():  # the store listing is cached for 3 s: rerun (a toggle, flipped
        assert time.time() < end, "the store listing never showed both runs"  # back) until then
        for _ in range(2):
            rerun(page, toggle.click, "flipping the spread bands")
    listing.click()
    idle(page)
    picker = page.get_by_role("combobox", name="Overlay on the importance chart")
    option = page.locator('[role="option"]').last  # the older run: seed 0
    rerun(page, lambda: choose(page, picker.click, option, "the older calibration in the picker"),
          "picking the older calibration to overlay")
    page.keyboard.press("Escape")
    visible(page, page.get_by_text(re.compile("Overlaid: 1 stored calibration")),
            "the overlay note", timeout_s=30)
    wait_for(page, "the overlay's legend entry",
             f"() => [...document.querySelectorAll('{PLOT} .legendtext')].some("
             "t => t.textContent.endsWith('· prefill'))")
    legend = page.locator(f"{PLOT} .legendtext").all_text_contents()  # SVG: no innerText
    assert any(t.endswith("· prefill") for t in legend), legend
    shot(page, "2_calibrate_overlay")
    # A download: the chart's data as CSV.
    page.get_by_text("Download this page's data and figures").click()
    with page.expect_download() as dl:
        page.get_by_role("button", name="Data (CSV)").click()
    csv_text = Path(dl.value.path()).read_text()
    assert csv_text.startswith("layer,prefill,decode") and len(csv_text.splitlines()) == 31
    t0 = time.time()
    page.get_by_role("button", name="Run calibration").click()
    visible(page, page.get_by_text(re.compile("loaded from the results store")),
            "the stored calibration's note", timeout_s=30)
    perf["cached_calibration_visible_s"] = round(time.time() - t0, 2)
    visible(page, page.locator(PLOT).first, "the stored calibration's chart")

    # Skip set: a preset, a single click on the strip, a box; the sidebar follows each.
    perf["switch_to_skip_set_s"] = round(open_page(page, "Skip set", "Skip set"), 2)
    visible(page, page.locator(PLOT).first, "the layer strip")
    visible(page, page.get_by_text("Ideal prefill speedup @ 128 tok", exact=True),
            "the ideal speedup metric", timeout_s=30)
    side = page.locator('[data-testid="stSidebar"]')

    def sidebar_says(pattern: str) -> None:
        visible(page, side.get_by_text(re.compile(pattern)), f"the sidebar to read /{pattern}/",
                timeout_s=30)

    rerun(page, page.get_by_role("button", name="Shallow", exact=True).click, "the Shallow preset")
    sidebar_says(r"Skip set:\s*0-9 \(10/30")
    assert "10 layers" in page.locator('[data-testid="stSlider"]').inner_text()
    assert "skip=0-9" in page.url, page.url
    click_square(page, 15)  # toggles layer 15 on
    sidebar_says(r"Skip set:\s*0-9, 15 \(11/30")
    click_square(page, 3)  # and layer 3 off
    sidebar_says(r"Skip set:\s*0-2, 4-9, 15 \(10/30")
    # The box tool, then a box over layers 24..29: they replace the set.
    tool = page.locator(f'{PLOT} .modebar-btn[data-title="Box Select"]').first
    visible(page, tool, "the strip's Box Select tool")
    tool.click()
    a = centre(page, SQUARES, 24, "square 24 of the layer strip to be laid out")
    b = centre(page, SQUARES, 29, "square 29 of the layer strip to be laid out")

    def box_over_24_to_29() -> None:
        page.mouse.move(a["left"] - 4, a["top"] - 12)
        page.mouse.down()
        page.mouse.move(b["right"] + 4, b["bottom"] + 12, steps=10)
        page.mouse.up()

    rerun(page, box_over_24_to_29, "a box over layers 24-29")
    sidebar_says(r"Skip set:\s*24-29 \(6/30")
    shot(page, "3_skip_set")

    # Generate: a short prompt, 8 tokens, full and POP side by side.
    perf["switch_to_generate_s"] = round(open_page(page, "Generate", "Generate"), 2)
    prompt = page.get_by_label("Prompt", exact=True)
    visible(page, prompt, "the prompt box")
    prompt.fill("Why is the sky blue?")
    rerun(page, lambda: prompt.press("Control+Enter"), "entering the prompt")
    set_number(page, "New tokens", 8)
    t0 = time.time()
    # The page shows a stored example's result (metrics, charts) before anyone generates: wait
    # for the run the click caused, not for a metric the example already shows.
    rerun(page, page.get_by_role("button", name="Generate").click, "the generation")
    perf["generation_s"] = round(time.time() - t0, 2)
    visible(page, page.get_by_text("Token agreement", exact=True), "the generation's metrics",
            timeout_s=30)
    assert not page.get_by_text("for your own run").count()  # the example was replaced
    visible(page, page.locator(PLOT).nth(2), "the generation's third chart", timeout_s=30)
    shot(page, "4_generate")
    for side in ("full", "pop"):  # both outputs hold generated text
        assert page.locator(f".st-key-gen-out-{side}").inner_text().strip(), side
        assert "<|im_end|>" not in page.locator(f".st-key-gen-out-{side}").inner_text()
    assert page.locator(PLOT).count() >= 3
    page.get_by_role("button", name="Explain with the logit lens").click()
    visible(page, page.get_by_text(re.compile("Commitment: the layer")), "the logit lens",
            timeout_s=120)
    idle(page)
    shot(page, "4b_generate_lens")

    for title, heading, name in (("Drift", "drift", "5_drift"), ("Sweeps", "Sweeps", "6_sweeps"),
                                 ("Overview", "Prefill-Only", "7_overview_again")):
        perf[f"switch_to_{title.lower()}_s"] = round(open_page(page, title, heading), 2)
        shot(page, name)
    visible(page, page.locator(PLOT).first, "the overview's chart", timeout_s=30)
    open_page(page, "Generate", "Generate")  # the prompt is still there
    assert page.get_by_label("Prompt", exact=True).input_value() == "Why is the sky blue?"
    assert loads(page) == 1, "switching pages reloaded the model"
    assert "Traceback" not in page.content()
    perf["load_per_core_at_start"] = round(LOAD_AT_START, 2)
    (SHOTS / "perf.json").write_text(json.dumps(perf, indent=1))
    print(json.dumps(perf, indent=1))
    # Timings are recorded for the benchmark report (perf.json), not asserted: a timed test
    # flakes on a shared machine. docs/benchmarks.md holds the measured figures.
