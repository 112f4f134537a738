"""Healing on the Generate page (AppTest, the embedded model): the policy and budget are offered,
the run heals, the page says when the cache became the full model's, and the call counts show
the healing chunks as a stage of their own; the step-through shows the healing pass as a step."""
from apptest_util import app, goto, temp_store, texts, wait_jobs  # noqa: F401 (fixture)


def test_generate_heals_under_a_budget_and_says_when_the_cache_became_exact():
    at = goto(app(), "generate")
    at.selectbox(key="gen.example").set_value("short: sky").run()
    at.number_input(key="gen.max_new").set_value(8)
    at.radio(key="gen.heal").set_value("budget").run()
    at.number_input(key="gen.heal_budget").set_value(16)
    at.number_input(key="gen.heal_chunk").set_value(8)
    at.button(key="gen.go").click().run()
    assert not at.exception and not at.error, texts(at.error)
    other = at.session_state["lab.generation"]["other"]
    rep = other["heal"]
    assert (rep["policy"], rep["budget_positions"], rep["chunk"]) == ("budget", 16, 8)
    assert rep["finished"], rep
    line = next(t for t in texts(at.info).split("\n") if t.startswith("Healing budget"))
    assert f"after token {rep['horizon_tokens']}" in line and "chunks of 8 positions" in line
    heal = other["counts"]["heal"]
    assert heal["attention"][20] == rep["chunks"] and heal["attention"][19] == 0  # layers f..L-1
    assert "healing budget 16 per step" in texts(at.caption)


def test_healing_is_offered_only_for_variants_it_can_heal():
    at = goto(app(), "generate")
    at.selectbox(key="gen.variant").set_value("static").run()
    assert at.radio(key="gen.heal").disabled
    at.selectbox(key="gen.variant").set_value("pop").run()
    assert not at.radio(key="gen.heal").disabled


def test_the_drift_page_shows_each_layers_drift_falling_to_zero_while_healing():
    at = goto(app(), "drift")
    shipped = at.session_state["lab.heal_drift"]  # class mode: the stored example first
    assert shipped["model"] == "smollm2-135m" and shipped["horizon"] is not None
    assert max(shipped["v"][-1]) < 1e-5 < max(shipped["v"][0][21:])
    assert any("Stored example: smollm2-135m" in t and "healed 64 positions per step" in t
               for t in texts(at.info).split("\n")), texts(at.info)
    assert f"after {shipped['horizon']} tokens" in texts(at.caption)
    at.number_input(key="drift.heal_budget").set_value(12)
    at.number_input(key="drift.heal_steps").set_value(6)
    at.button(key="drift.heal_go").click().run()
    assert not at.exception and not at.error, texts(at.error)
    res = at.session_state["lab.heal_drift"]
    assert res["heal"]["budget_positions"] == 12 and res["horizon"] is not None
    assert res["healed"][-1] > res["prompt_tokens"]
    first, last = res["v"][0], res["v"][-1]
    assert max(first[21:]) > 1e-3 and max(last) < 1e-5  # layers above f=20 drift, then none do
    assert f"after {res['horizon']} tokens" in texts(at.caption)
    assert "healed 64 positions per step" not in texts(at.info)  # the user's run replaced it
    at.button(key="example.heal_drift").click().run()
    assert at.session_state["lab.heal_drift"] == shipped


def test_the_step_through_shows_the_healing_pass_between_the_first_token_and_decode():
    at = goto(app(), "stepthrough")
    at.text_input(key="step.prompt").set_value("The first three planets from the Sun are "
                                               "Mercury, Venus and Earth.").run()
    at.radio(key="step.heal").set_value("eager").run()
    wait_jobs(at.button(key="step.go").click().run())
    assert not at.exception and not at.error, texts(at.error)
    rec = at.session_state["lab.stepthrough"]
    assert rec.config["heal"]["policy"] == "eager" and rec.skip_layers == list(range(20, 30))
    heal = next(s for s in rec.steps if s["stage"] == "heal 1")
    assert heal["attention"][20] == list(range(len(rec.prompt_ids))) and heal["attention"][19] == []
    at.session_state["step.i"] = 3  # the frame after POP's boundary step
    at.run()
    assert "Healing before decode step 1: layers 20-29 re-run" in texts(at.markdown)
    assert "healing eager" in texts(at.subheader)
