"""Prompt precision in a real browser: a link with int8 layers opens the Skip set page with the
int8 set in the sidebar box and the page's section, the per-layer plan shown, the frontier's
button offered; the step-through draws int8 layers in their own colour. Screenshots under
artifacts/screenshots/ (precision_*.png)."""
import re

from browser_wait import PLOT, fail_with_shot, gone, idle, rerun, shot, visible, wait_for

# The text of the step's grid once it is drawn (null while the chart is absent or redrawing: a
# Plotly chart has no text for a moment while it is replaced).
GRID_TEXT = """() => {
  const grid = [...document.querySelectorAll('.js-plotly-plot')]
    .find(e => e.isConnected && e.innerText.includes('What runs in this step'));
  return grid ? grid.innerText : null;
}"""


def test_int8_layers_from_a_link_and_the_frontier(server, browser_page):
    page = browser_page
    page.goto(f"{server['url']}/skip_set?model=smollm2-135m&skip=20-29&int8=0-19")
    visible(page, page.get_by_text("Prompt precision (int8)"), "the precision section",
            timeout_s=300)
    idle(page)
    visible(page, page.get_by_text("IIIIIIIIIIIIIIIIIIIISSSSSSSSSS"), "the per-layer plan")
    box = page.locator('input[aria-label="Prompt int8 layers"]')
    assert box.input_value() == "0-19"
    page.get_by_text("Prompt precision (int8)").scroll_into_view_if_needed()
    shot(page, "precision_section")
    # Measuring the frontier times several configurations: the AppTest in
    # tests/dashboard/test_precision_dashboard.py runs it; here the button is offered.
    visible(page, page.get_by_role("button", name="Measure the frontier"), "the frontier's button")


def test_the_step_through_draws_int8_layers_in_their_own_colour(server, browser_page):
    page = browser_page
    page.goto(f"{server['url']}/stepthrough?model=smollm2-135m&skip=20-29&int8=0-19")
    visible(page, page.get_by_text(re.compile("prompt in int8: 0-19")), "the int8 layers named",
            timeout_s=300)
    page.get_by_role("button", name="Record this prompt").click()
    # the stored example (no int8) shows until the recording replaces it
    gone(page, page.get_by_text("Stored example: smollm2-135m"), "the stored example replaced",
         timeout_s=600)
    grid = page.locator(PLOT).filter(has_text=re.compile("What runs in this step"))
    visible(page, grid, "the recorded step's grid", timeout_s=600)
    idle(page)
    for _ in range(8):  # the full run's steps may come first: step on to POP's prefill
        text = wait_for(page, "the step's grid drawn", GRID_TEXT, timeout_s=120)
        if "attention + FFN in int8" in text:
            break
        rerun(page, page.get_by_role("button", name=re.compile("Next")).first.click,
              "stepping on")
    else:
        fail_with_shot(page, "a step drawing int8 layers", "8 steps on")
    grid.first.scroll_into_view_if_needed()
    shot(page, "precision_stepthrough")
