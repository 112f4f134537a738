"""What a class sees, through AppTest on a fresh results store: the Overview names a stored
example as one, the step-through tells one speed story (and warns when its rounds disagree), the
presenter's view puts the grid and the clock first, another model's outcome line does not follow
a model switch, a link's unusable ?skip= is named in one line, a number out of range is refused
where it is typed (nothing runs), and tables hold rounded numbers."""
import dataclasses

from apptest_util import app, charts, goto, notes, temp_store, texts, wait_jobs  # noqa: F401
from test_classmode import app_with_query


def test_the_overview_names_the_stored_example_as_one():
    at = app()  # the model loads; the session now holds the stored step-through
    caption = texts(at.caption)
    assert "From the stored example: smollm2-135m" in caption
    assert "your step-through" not in caption


def test_the_step_through_tells_one_speed_story_and_warns_when_the_rounds_disagree():
    at = goto(app(), "stepthrough")
    rec = at.session_state["lab.stepthrough"]
    line = next(c.value for c in at.caption if c.value.startswith("First token:"))
    assert f"full {rec.ttft['full_ms']:.0f} ms, POP {rec.ttft['pop_ms']:.0f} ms" in line
    # the clock's first-token marks are these medians (a record from before says why not)
    assert ("The clock draws each model's median round" if "clock" in rec.ttft
            else "they need not add up to the medians above") in line
    assert f"{len(rec.tokens)} tokens" in line
    flagged = dataclasses.replace(rec, ttft={**rec.ttft, "trustworthy": False,
                                             "note": "rounds disagree (IQR 0.94-1.31x)"})
    at.session_state["lab.stepthrough"] = flagged
    at.run()
    assert "Speed flagged, not a figure to quote: rounds disagree (IQR 0.94-1.31x)" in texts(at.warning)
    assert "Speedup ⚠" in next(c.value for c in at.caption if c.value.startswith("First token:"))


def test_the_presenters_step_through_puts_the_grid_and_the_clock_first():
    at = app_with_query(present="1")
    goto(at, "stepthrough")
    kinds = [e.type for e in _walk(at.main) if e.type in ("plotly_chart", "metric", "expander")]
    assert kinds[:2] == ["plotly_chart", "plotly_chart"], kinds  # the grid, then the clock
    assert "metric" in kinds and kinds[-1] == "expander", "the rest below; the recorder folded"


def _walk(node):
    """Every element under `node`, in the order the page drew them."""
    for _, child in sorted(getattr(node, "children", {}).items()):
        yield child
        yield from _walk(child)


def test_another_models_outcome_line_does_not_follow_a_model_switch():
    at = goto(app(), "stepthrough")
    at.text_input(key="step.prompt").set_value("One two three four").run()
    wait_jobs(at.button(key="step.go").click().run())
    said = [t for t in (s.value for s in at.success) if t.startswith("Step-through:")]
    assert said, texts(at.success)
    at.radio(key="w.model_source").set_value("Embedded (Gemma-3-270M, offline)").run()
    assert at.session_state["lab.stepthrough"].model == "gemma3-270m"
    assert not any(t.startswith("Step-through:") for t in (s.value for s in at.success))
    at.radio(key="w.model_source").set_value("Embedded (SmolLM2-135M, offline)").run()
    assert said[0] in texts(at.success), "the line is SmolLM2's again"


def test_a_links_unusable_skip_set_is_named_in_one_line():
    at = app_with_query(skip="20-abc")
    line = next(e.value for e in at.error if "skip set" in e.value)
    assert line.startswith("The link's skip set '20-abc' is refused: ")
    assert line.endswith("Showing the paper's last third until you choose one.")
    assert "\n" not in line
    at = app_with_query(skip="25-40")  # readable, but SmolLM2 has 30 layers
    line = next(e.value for e in at.error if "skip set" in e.value)
    assert line.startswith("The link's skip set '25-40' is refused: ") and "30" in line


def test_a_number_out_of_range_is_refused_where_it_is_typed_and_nothing_runs():
    at = goto(app(), "generate")
    shown = at.session_state["lab.generation"]
    at.number_input(key="gen.max_new").set_value(5000).run()
    assert "New tokens must lie in 1..512; got 5000. Nothing runs until it does." in texts(at.error)
    assert at.button(key="gen.go").disabled
    assert at.session_state["lab.generation"] is shown
    at.number_input(key="gen.max_new").set_value(16).run()
    assert not at.error and not at.button(key="gen.go").disabled
    assert type(at.number_input(key="gen.max_new").value) is int  # a count, not 16.00
    goto(at, "sweeps")
    at.number_input(key="sw.rep").set_value(2).run()
    assert "Timing rounds (at least) must lie in 3..50; got 2" in texts(at.error)
    assert at.button(key="sw.go").disabled


def test_tables_hold_rounded_numbers():
    at = goto(app(), "sweeps")
    frame = next(d.value for d in at.dataframe if "prefill speedup" in d.value.columns)
    floats = [v for col in frame.columns for v in frame[col] if isinstance(v, float) and v == v]
    assert floats, "the sweep table has numbers"
    assert all(float(f"{v:.4g}") == v for v in floats), [v for v in floats if float(f"{v:.4g}") != v][:5]
