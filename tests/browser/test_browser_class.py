"""A class in a real browser, on a fresh results store: the first page's text and recorded run
before the model has loaded, every page with a chart before anything runs (the stored
examples), the step-through driven from the keyboard with a screenshot of every step, PageDown
to the next page, and the presenter's view from ?present=1.

Screenshots go to artifacts/screenshots/class_*.png; times to artifacts/screenshots/class_perf.json
(recorded, not asserted: docs/benchmarks.md reports them, bench/first_content_bench.py measures
them over rounds).
"""
import json
import re
import time

from browser_wait import PLOT, SHOTS, idle, open_page, rerun, shot, visible, wait_for

# Every page but Serve, whose charts need the serving engine (a 600 MB install) to have run.
PAGES = (("Step through", "Step through POP"), ("Calibrate", "Calibrate"),
         ("Skip set", "Skip set"), ("Generate", "Generate"), ("Drift", "Representation drift"),
         ("Sweeps", "Sweeps"))
STEP = """() => { const m = document.body.innerText.match(/Step (\\d+) of (\\d+)/);
                   return m ? [Number(m[1]), Number(m[2])] : null; }"""
FONT = "() => getComputedStyle(document.documentElement).fontSize"
SIDEBAR_COLLAPSED = """() => document.querySelector('[data-testid="stSidebar"]')
                                ?.getAttribute('data-collapsed')"""


# Where the presenter's first screen ends: the title below the top bar, the grid's and the clock's
# drawn area (axes included) within the window.
FIRST_SCREEN = """() => {
  const h1 = document.querySelector('h1'), bar = document.querySelector('[data-testid="stHeader"]');
  const plots = [...document.querySelectorAll('.js-plotly-plot .cartesianlayer')];
  if (!h1 || !bar || plots.length < 2) return null;
  return {title_top: h1.getBoundingClientRect().top, bar_bottom: bar.getBoundingClientRect().bottom,
          height: window.innerHeight, plots: plots.map(p => p.getBoundingClientRect().bottom)};
}"""


def step_of(page) -> list[int]:
    return wait_for(page, "the step counter", STEP)


def press(page, key: str, what: str) -> None:
    page.locator("h1").first.click()  # the keys go to the page, not to a box that had the focus
    rerun(page, lambda: page.keyboard.press(key), what)


def test_a_class_on_a_fresh_store(server, browser_page):
    page, perf = browser_page, {}
    t0 = time.time()
    page.goto(server["url"])
    visible(page, page.get_by_role("heading", name="Prefill-Only Pruning (POP)"), "the Overview's title")
    perf["first_text_after_connect_s"] = round(time.time() - t0, 2)
    visible(page, page.locator(PLOT).first, "the Overview's recorded run", timeout_s=120)
    perf["first_chart_after_connect_s"] = round(time.time() - t0, 2)
    perf["first_chart_after_server_ready_s"] = round(time.time() - server["t_healthy"], 2)
    visible(page, page.get_by_text(re.compile(r"loads in this server: 1")), "the model, loaded")
    perf["model_loaded_after_connect_s"] = round(time.time() - t0, 2)
    idle(page)
    shot(page, "class_1_overview")

    for title, heading in PAGES:  # each page draws its stored example before anything runs
        perf[f"open_{title}_s"] = round(open_page(page, title, heading), 2)
        visible(page, page.locator(PLOT).first, f"a chart on {title}", timeout_s=60)
        visible(page, page.get_by_text(re.compile("Stored example: smollm2-135m")).first
                if title != "Skip set" else page.locator(PLOT).first, f"the example label on {title}")
    shot(page, "class_2_sweeps_example")

    open_page(page, "Step through", "Step through POP")
    assert step_of(page)[0] == 1
    last = step_of(page)[1]
    shot(page, "class_step_1")
    for k in range(2, last + 1):  # → through every step, a screenshot of each
        press(page, "ArrowRight", f"→ to step {k}")
        assert step_of(page)[0] == k
        assert f"step={k}" in page.url, page.url
        if k == 3:
            visible(page, page.get_by_text("Next-token candidates (orange: the token picked)"),
                    "the boundary step's candidates")
        shot(page, f"class_step_{k}")
    press(page, "ArrowLeft", "← back one step")
    assert step_of(page)[0] == last - 1
    press(page, " ", "space: play")
    wait_for(page, "play to reach the last step", f"() => ({STEP})()?.[0] === {last}",
             timeout_s=60)
    idle(page)
    assert page.get_by_role("button", name=re.compile("Play")).count(), "stopped at the end"
    press(page, "PageDown", "PageDown: the next page")
    visible(page, page.get_by_role("heading", name=re.compile("Calibrate")), "the Calibrate page")

    page.set_viewport_size({"width": 1440, "height": 900})  # a lecture hall's projector
    page.goto(server["url"] + "/stepthrough?present=1&step=3")
    visible(page, page.locator(PLOT).nth(1), "the presenter's step-through", timeout_s=120)
    idle(page)
    wait_for(page, "large type", f"() => ({FONT})() === '21px'")
    wait_for(page, "the sidebar collapsed", f"() => ({SIDEBAR_COLLAPSED})() === 'true'")
    assert step_of(page)[0] == 3 and not page.get_by_text("Download this page's data").count()
    screen = wait_for(page, "the first screen laid out", FIRST_SCREEN)
    assert screen["title_top"] >= screen["bar_bottom"], f"the title under the top bar: {screen}"
    assert max(screen["plots"][:2]) <= screen["height"], f"grid and clock below the fold: {screen}"
    page.screenshot(path=str(SHOTS / "class_3_presenter_1440x900.png"))
    shot(page, "class_3_presenter_boundary")
    open_sidebar = page.locator('[data-testid="stExpandSidebarButton"]')
    open_sidebar.click()  # the toggle, off again: the view returns, the sidebar stays open
    toggle = page.get_by_text("Presenter's view")
    visible(page, toggle, "the presenter toggle")
    rerun(page, toggle.click, "the presenter's view off")
    wait_for(page, "normal type", f"() => ({FONT})() === '16px'")
    assert "present=1" not in page.url
    rerun(page, lambda: page.keyboard.press("ArrowRight"), "→ right after the toggle, no click")
    assert step_of(page)[0] == 4, "the keys work after the sidebar toggle"
    assert "Traceback" not in page.content()
    (SHOTS / "class_perf.json").write_text(json.dumps(perf, indent=1))
    print(json.dumps(perf, indent=1))


# The clock's dotted first-token marks (shapes: the full model's first, then POP's), read from the
# figure the page drew.
FIRST_TOKENS = """() => {
  const clock = [...document.querySelectorAll('.js-plotly-plot')]
    .find(p => (p.textContent || '').includes('One clock for both models'));
  const gd = clock && (clock.layout ? clock : clock.querySelector('.js-plotly-plot'));
  const marks = (gd?._fullLayout?.shapes || gd?.layout?.shapes || [])
    .filter(s => s.line && s.line.dash === 'dot');
  if (marks.length !== 2) return null;
  // rows from the bottom: POP's mark spans row 0, the full model's row 1
  const [pop, full] = [...marks].sort((a, b) => a.y0 - b.y0);
  return {full: full.x0, pop: pop.x0};
}"""


def test_the_shipped_step_throughs_show_pops_first_token_earlier(server, browser_page):
    """The lesson on the clock of each embedded model's stored example: POP's first token comes
    before the full model's; so on the stored healing example, whose frames reach a healing pass
    from the keyboard."""
    page = browser_page
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.goto(server["url"] + "/stepthrough")
    for name, label in (("smollm2-135m", "SmolLM2-135M"), ("gemma3-270m", "Gemma-3-270M")):
        if name.startswith("gemma"):
            radio = page.get_by_text(f"Embedded ({label}, offline)")
            rerun(page, radio.click, f"switching to {label}")
        visible(page, page.get_by_text(f"Stored example: {name}").first,
                f"the stored example of {name}", timeout_s=180)
        clock = page.locator(PLOT).filter(has_text=re.compile("One clock for both models"))
        visible(page, clock.first, f"the clock of {name}", timeout_s=180)
        clock.first.scroll_into_view_if_needed()
        marks = wait_for(page, f"the first-token marks of {name}", FIRST_TOKENS)
        assert marks["pop"] < marks["full"], (name, marks)
        shot(page, f"class_clock_{name}")
        healing = page.get_by_role("button", name="Show the stored healing example")
        rerun(page, healing.click, f"the stored healing example of {name}")
        visible(page, page.get_by_text(re.compile("healing budget 16 positions per step")).first,
                f"the healing example of {name}")
        marks = wait_for(page, f"the healing example's first-token marks of {name}", FIRST_TOKENS)
        assert marks["pop"] < marks["full"], (name, marks)
        for _ in range(8):  # → to the first healing pass (frame 4: after the boundary step)
            if page.get_by_text("Healing before decode step 1").count():
                break
            press(page, "ArrowRight", "→ towards the healing pass")
        visible(page, page.get_by_text(re.compile("Healing before decode step 1: layers")).first,
                f"the first healing pass of {name}")
        shot(page, f"class_heal_step_{name}")
