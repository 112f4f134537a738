"""The step-through's variants of POP in a real browser. Prompt precision: a link with int8 layers
opens the Skip set page with the int8 set in the sidebar box and the page's section, the per-layer
plan shown, the frontier's button offered; the step-through draws int8 layers in their own colour.
Self-healing: a healed recording shows the healing pass as a step of its own, between the first
token and decode step 1. Screenshots under artifacts/screenshots/ (precision_*.png, heal_*.png)."""
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


def test_the_step_through_shows_a_healing_pass_as_a_step(server, browser_page):
    page = browser_page
    page.goto(f"{server['url']}/stepthrough?model=smollm2-135m&skip=20-29")
    healing = page.get_by_role("radiogroup", name="Healing (after the first token)")
    visible(page, healing, "the healing choice", timeout_s=300)
    idle(page)
    rerun(page, healing.get_by_text("eager", exact=True).click, "choosing eager healing")
    visible(page, page.get_by_text(re.compile("Healing: eager")), "the healing named")
    rerun(page, page.get_by_role("button", name="Record this prompt").click, "recording")
    visible(page, page.get_by_text(re.compile(r"skipped 20-29 · healing eager")),
            "the healed recording", timeout_s=600)
    idle(page)
    title = page.get_by_text(re.compile("Healing before decode step 1: layers 20-29 re-run"))
    for _ in range(6):  # the full prefill, POP's prefill and its boundary step come first
        if title.count():
            break
        rerun(page, page.get_by_role("button", name=re.compile("Next")).first.click,
              "stepping on")
    else:
        fail_with_shot(page, "the healing pass's step", "6 steps on")
    text = wait_for(page, "the healing step's grid drawn", GRID_TEXT, timeout_s=120)
    assert "What runs in this step" in text
    page.locator(PLOT).filter(has_text=re.compile("What runs in this step")).first \
        .scroll_into_view_if_needed()
    shot(page, "heal_stepthrough")
