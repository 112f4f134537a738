"""The Methods page and the Skip set page's budgeted choice through AppTest, on the embedded
model with small settings (results in a temporary store)."""
from dashboard.session import report

from apptest_util import app, charts, goto, temp_store, texts, wait_jobs  # noqa: F401 (fixture)


def ranked(at):
    """A fast run: the forward-only methods and the baselines on 2 built-in prompts."""
    at.multiselect(key="imp.methods").set_value(["bi", "angular", "magnitude", "tail", "random"])
    at.number_input(key="imp.n").set_value(2)
    return wait_jobs(at.button(key="imp.go").click().run())


def test_methods_page_ranks_compares_and_uses_a_set():
    at = goto(app(), "methods")
    assert "No importance run yet" in texts(at.info)
    ranked(at)
    assert not at.exception and not at.error, texts(at.error)
    res = at.session_state["lab.importance"]
    assert res.methods == ["bi", "angular", "magnitude", "tail", "random"] and res.n_samples == 2
    assert len(charts(at)) == 3, "curves, agreement, triangle"
    assert "stored for next time" in texts(at.success)
    # a method's set for any k becomes the skip set of every page
    at.selectbox(key="imp.use.m").set_value("tail").run()
    at.slider(key="imp.use.k").set_value(6).run()
    at.button(key="imp.use.go").click().run()
    assert at.session_state["lab.skip"] == tuple(range(24, 30))
    assert "Skip set:** 24-29" in texts(at.sidebar.markdown)
    # the comparison: one budget, free sets, 2 held-out items, no timing
    at.multiselect(key="cmp.budgets").set_value([0.33])
    at.multiselect(key="cmp.shapes").set_value(["free"])
    at.number_input(key="cmp.n").set_value(2)
    at.number_input(key="cmp.seeds").set_value(1)
    wait_jobs(at.button(key="cmp.go").click().run())
    assert not at.exception and not at.error, texts(at.error)
    cmp = at.session_state["lab.method_compare"]
    assert cmp.n == 2 and {r["method"] for r in cmp.rows} == {"bi", "angular", "magnitude", "tail", "random"}
    assert "33% (10 layers, free): best" in texts(at.markdown)
    assert len(charts(at)) == 4, "plus one frontier"
    point = next(i for i, r in enumerate(cmp.rows) if r["method"] == "bi")
    at.selectbox(key="cmp.point").set_value(point).run()
    at.button(key="cmp.use").click().run()
    assert at.session_state["lab.skip"] == tuple(cmp.rows[point]["skip_layers"])
    goto(at, "methods")
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Data (CSV)" in labels and "Data (JSON)" in labels
    assert {"Figure: curves (HTML)", "Figure: agreement (HTML)", "Figure: frontier free (HTML)"} <= set(labels)
    page = report.build({"model": "smollm2-135m", "skip": at.session_state["lab.skip"],
                         "models": {"smollm2-135m": {"lab.importance": (res, {}),
                                                     "lab.method_compare": (cmp, {})}}})
    assert "Importance methods: builtin, 2 prompts" in page and "33% (10 layers, free): best" in page
    goto(at, "generate")
    assert f"Skip set:** {cmp.rows[point]['set']}" in texts(at.sidebar.markdown)


def test_bad_input_on_the_methods_page_is_shown_where_the_user_acted():
    at = goto(app(), "methods")
    at.multiselect(key="imp.methods").set_value([]).run()
    at.button(key="imp.go").click().run()
    assert not at.exception and "Cannot rank: no importance method chosen" in texts(at.error)
    ranked(at)
    at.multiselect(key="cmp.budgets").set_value([]).run()
    at.button(key="cmp.go").click().run()
    assert not at.exception and "Cannot compare: give budgets" in texts(at.error)
    assert at.title[0].value.startswith("Methods"), "the page keeps running"


def test_budgeted_choice_on_the_skip_set_page():
    at = goto(app(), "skip_set")
    at.checkbox(key="bud.use_nll").uncheck().run()
    at.button(key="bud.go").click().run()
    assert not at.exception and "Cannot search: give a budget" in texts(at.error)
    # a budget no set meets: the search says so and offers the best set it found
    at.checkbox(key="bud.use_top1").check().run()
    at.number_input(key="bud.top1").set_value(1.0)
    at.selectbox(key="bud.method").set_value("bi")
    at.number_input(key="bud.n").set_value(2)
    at.number_input(key="bud.rank_n").set_value(2)
    at.number_input(key="bud.most").set_value(4)
    wait_jobs(at.button(key="bud.go").click().run())
    assert not at.exception
    res = at.session_state["lab.choice"]
    assert not res.met and len(res.candidates) == 4 and res.best_found is not None
    assert "no skip set meets top-1 agreement lower bound >= 100%" in texts(at.warning)
    assert len(charts(at)) >= 2, "the strip and the candidates"
    at.button(key="bud.use").click().run()
    assert at.session_state["lab.skip"] == tuple(res.best_found["skip_layers"])
    assert "Figure: candidates (HTML)" in [b.proto.label for b in at.get("download_button")]
    page = report.build({"model": "smollm2-135m", "skip": (),
                         "models": {"smollm2-135m": {"lab.choice": (res, {})}}})
    assert "Budgeted choice (Block Influence, free sets)" in page and "no skip set meets" in page


def test_certified_choice_on_the_skip_set_page():
    at = goto(app(), "skip_set")
    splits = next(d.value for d in at.dataframe if "fingerprint" in d.value)  # before any run
    assert list(splits["split"]) == ["ranking", "selection", "certification"]
    assert list(splits["n"]) == [8, 100, 300] and list(splits["items"])[1:] == ["0-99", "100-399"]
    at.number_input(key="cert.cer_off").set_value(50).run()  # overlaps the selection items
    assert not at.exception and "Cannot certify: the selection split (gsm8k items 0-99) overlaps " \
        "the certification split (gsm8k items 50-349)" in texts(at.error)
    assert at.button(key="cert.go").disabled, "no run on overlapping splits"
    at.number_input(key="cert.sel_n").set_value(4)
    at.number_input(key="cert.cer_off").set_value(4)
    at.number_input(key="cert.cer_n").set_value(12)
    at.number_input(key="cert.alpha").set_value(0.3)
    at.number_input(key="cert.most").set_value(3)
    at.number_input(key="cert.rank_n").set_value(2).run()
    assert not at.error, texts(at.error)
    wait_jobs(at.button(key="cert.go").click().run())
    assert not at.exception and not at.error, texts(at.error)
    res = at.session_state["lab.certificate"]
    assert res.met and res.certified and [s["n"] for s in res.splits] == [2, 4, 12]
    assert ("Certified: at most 30% of items lose more than 0.1 nats per token, with 95% "
            "confidence, on 12 items it never chose on.") in texts(at.success)
    assert "Not covered: The guarantee covers items drawn like the certification items" in \
        texts(at.caption)
    at.button(key="cert.use").click().run()
    assert at.session_state["lab.skip"] == tuple(res.certified)
    page = report.build({"model": "smollm2-135m", "skip": (),
                         "models": {"smollm2-135m": {"lab.certificate": (res, {})}}})
    assert "Certified choice (Tail, free sets)" in page and "it never chose on" in page
