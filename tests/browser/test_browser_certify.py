"""The Skip set page's certified choice in a real browser: the three splits are listed before
anything runs, an overlap is refused where it is set, a small certification runs and its
certificate reads in plain words; screenshots under artifacts/screenshots/."""
from browser_wait import idle, open_page, rerun, set_number, shot, visible


def test_the_certificate_in_a_real_browser(server, browser_page):
    page = browser_page
    page.goto(server["url"])
    idle(page)
    open_page(page, "Skip set", "Skip set")
    visible(page, page.get_by_text("Certified choice", exact=True), "the certified choice")
    set_number(page, "Certification: first GSM8K item", 50)
    visible(page, page.get_by_text("Cannot certify: the selection split (gsm8k items 0-99) "
                                   "overlaps the certification split (gsm8k items 50-349)"),
            "the overlap refused where it was set")
    for label, value in (("Selection items", 2), ("Certification: first GSM8K item", 2),
                         ("Certification items", 12), ("Prompts ranking the layers (built-in)", 1),
                         ("Longest sequence (sets)", 1)):
        set_number(page, label, value)
    set_number(page, "α: bad items at most", 0.3)
    rerun(page, page.get_by_role("button", name="Certify a set").click, "certifying a set")
    certified = page.get_by_text("Certified: at most 30% of items lose more than 0.1 nats per "
                                 "token, with 95% confidence, on 12 items it never chose on.")
    visible(page, certified, "the certificate in plain words", timeout_s=1200)
    visible(page, page.get_by_text("Not covered: The guarantee covers", exact=False),
            "what the guarantee does not cover")
    visible(page, page.get_by_role("button", name="Use this set: layers 29"), "Use this set")
    shot(page, "7_certified_choice")
