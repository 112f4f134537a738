"""Class mode and the presenter's view through AppTest, on a fresh results store: every page
opens with the stored example of the loaded model, labelled; the user's own run replaces it and
a button brings it back; results follow the model; the presenter's view from its toggle and
from ?present=1."""
from apptest_util import app, charts, goto, temp_store, texts, wait_jobs  # noqa: F401 (fixture)

PAGES = {"stepthrough": "lab.stepthrough", "calibrate": "lab.calibration",
         "generate": "lab.generation", "drift": "lab.drift", "sweeps": "lab.sweep"}


def label(at) -> str:
    return texts(at.info)


def test_every_page_opens_with_the_labelled_example():
    at = app()
    assert charts(at), "the Overview draws the recorded run"
    for page, key in PAGES.items():
        goto(at, page)
        assert at.session_state[key] is not None, page
        assert "Stored example: smollm2-135m" in label(at), page
        assert "machine" not in label(at) or "threads" in label(at), page  # the machine, named
        assert charts(at), f"{page} draws a chart before anything runs"
    assert "stored example" not in texts(at.error).lower()


def test_an_own_run_replaces_the_example_and_a_button_brings_it_back():
    at = goto(app(), "stepthrough")
    example = at.session_state["lab.stepthrough"]
    at.text_input(key="step.prompt").set_value("One two three four five six").run()
    wait_jobs(at.button(key="step.go").click().run())
    own = at.session_state["lab.stepthrough"]
    assert own is not example and own.prompt == "One two three four five six"
    assert "Stored example" not in label(at)
    assert len(charts(at)) >= 2, "the grid and the clock of the user's run"
    at.button(key="example.stepthrough").click().run()
    assert at.session_state["lab.stepthrough"].prompt == example.prompt
    assert "Stored example: smollm2-135m" in label(at)


def test_the_stored_healing_example_is_one_button_away_and_steps_through_its_heal_passes():
    at = goto(app(), "stepthrough")
    plain = at.session_state["lab.stepthrough"]
    assert _policy(plain) == "none", "a session opens on the paper's POP"
    at.button(key="example.heal_stepthrough").click().run()
    healed = at.session_state["lab.stepthrough"]
    assert healed.prompt == plain.prompt and healed.config["heal"]["policy"] == "budget"
    assert "healing budget 16 positions per step" in texts(at.subheader)
    assert "Stored example: smollm2-135m" in label(at)
    stages = [s["stage"] for s in healed.steps if s["run"] == "pop"]
    assert stages[:3] == ["prefill", "boundary", "heal 1"] and "heal 3" in stages
    assert not _has(at, "example.heal_stepthrough") and _has(at, "example.stepthrough")
    at.button(key="example.stepthrough").click().run()  # and back to the plain one
    assert _policy(at.session_state["lab.stepthrough"]) == "none"
    assert _has(at, "example.heal_stepthrough") and not _has(at, "example.stepthrough")


def _policy(rec) -> str:
    return (rec.config.get("heal") or {}).get("policy", "none")


def _has(at, key: str) -> bool:
    return any(b.key == key for b in at.button)


def test_results_follow_the_model_and_the_keyboard_frame_is_in_the_url():
    at = goto(app(), "stepthrough")
    at.button(key="step-next").click().run()
    at.button(key="step-next").click().run()
    assert at.query_params["step"] == "3" and "Step 3 of" in texts(at.markdown)
    at.radio(key="w.model_source").set_value("Embedded (Gemma-3-270M, offline)").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["lab.stepthrough"].model == "gemma3-270m"
    assert at.session_state["lab.generation"]["model"] == "gemma3-270m"
    assert "Stored example: gemma3-270m" in label(at)
    at.radio(key="w.model_source").set_value("Embedded (SmolLM2-135M, offline)").run()
    assert at.session_state["lab.stepthrough"].model == "smollm2-135m"


def test_the_presenters_view_from_the_toggle_and_from_the_link():
    at = goto(app(), "generate")
    assert any("Download" in e.label for e in at.expander)
    at.toggle(key="w.present").set_value(True).run()
    assert at.session_state["lab.present"] and at.query_params["present"] == "1"
    assert not any("Download" in e.label for e in at.expander), "fewer controls"
    assert any("font-size: 21px" in str(h.proto) for h in at.get("html"))
    at.toggle(key="w.present").set_value(False).run()
    assert "present" not in at.query_params
    linked = app_with_query(present="1")
    assert linked.session_state["lab.present"] and linked.toggle(key="w.present").value


def app_with_query(**query):
    from streamlit.testing.v1 import AppTest

    from apptest_util import APP

    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params.update(query)
    return at.run()
