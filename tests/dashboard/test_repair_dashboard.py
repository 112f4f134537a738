"""The K/V repair on the dashboard (AppTest, embedded model): the Skip set page fits and lists
repairs; Generate, Drift, Sweeps and Serve (its engine's variants; the serving venv must be built)
offer pop_repair only where a stored repair exists for the model and skip set. One fit (layers 20-29, the paper's third; 48 built-in prompts) in a temporary
store."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.panels.kv_repair import LABEL
from dashboard.panels.serve_engines import VARIANT_LABELS

from apptest_util import wait_jobs


def serves(*variants) -> list[str]:
    """The Serve page's engine choices, as the radio shows them."""
    return [VARIANT_LABELS[v] for v in variants]

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
SKIP = tuple(range(20, 30))


@pytest.fixture(scope="module", autouse=True)
def temp_store(tmp_path_factory, embedded):
    """A results store of this module's own (the converted models linked in)."""
    from pop_analysis.store.paths import cache_dir

    models = cache_dir() / "models"
    tmp = tmp_path_factory.mktemp("repair_dash")
    (tmp / "models").symlink_to(models, target_is_directory=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POP_LAB_CACHE", str(tmp))
        yield tmp
    embedded.adapter.kv_maps.clear()


def page(name: str, skip=SKIP) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300).run()
    at.session_state["lab.skip"] = tuple(skip)
    at.session_state["lab.skip_n_layers"] = 30
    at.switch_page(f"../pages/{name}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def said(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def test_before_any_fit_pop_repair_is_not_offered():
    at = page("generate")
    assert LABEL not in at.selectbox(key="gen.variant").options
    at = page("drift")
    assert at.radio(key="drift.variant").options == ["POP"]
    at = page("sweeps")
    assert at.checkbox(key="sw.repair").disabled
    assert page("serve").radio(key="serve.variant").options == serves("pop", "full")


def test_too_few_tokens_and_a_scattered_skip_set_are_one_line_where_the_user_acted():
    at = page("skip_set")
    at.number_input(key="repair.n.builtin").set_value(8)
    at.button(key="repair.go").click().run()
    err = said(at.error)
    assert "too few calibration tokens" in err and "needs at least 1154" in err, err
    at = page("skip_set", (3, 7))
    assert at.button(key="repair.go").disabled
    assert "one contiguous block" in said(at.info)


def test_fit_lists_the_repair_and_the_pages_offer_pop_repair():
    at = page("skip_set")
    at.number_input(key="repair.n.builtin").set_value(48)
    at.button(key="repair.go").click().run()
    assert not at.error, said(at.error)
    assert "Repair of layers 20-29: fitted in" in said(at.success)
    table = next(d.value for d in at.dataframe if "skip set" in d.value.columns)
    assert list(table["skip set"]) == ["20-29"] and list(table["current"]) == ["✓"]
    assert table["memory"][0] == f"{10 * 2 * 192 * 577 * 4 / 2**20:.1f} MiB"
    at.button(key="repair.go").click().run()  # same data and settings: reused
    assert "already stored" in said(at.success)

    at = page("generate")
    assert LABEL in at.selectbox(key="gen.variant").options
    at.text_area(key="gen.prompt").set_value("Name three colours of the rainbow.")
    at.selectbox(key="gen.variant").set_value("pop_repair")
    at.number_input(key="gen.max_new").set_value(3)
    at.button(key="gen.go").click().run()
    assert not at.exception and not at.error, said(at.error)
    gen = at.session_state["lab.generation"]
    assert gen["engine"] == "pop_repair" and gen["other"]["token_ids"]
    assert gen["other"]["counts"]["prefill"]["attention"][28] == 0, "layer 28 skipped in prefill"

    at = page("drift")
    at.text_area(key="drift.prompt").set_value("Explain photosynthesis in two sentences.")
    at.number_input(key="drift.steps").set_value(2)
    at.radio(key="drift.variant").set_value("pop_repair")
    wait_jobs(at.button(key="drift.go").click().run())
    res = at.session_state["lab.drift"]
    assert res.variant == "pop_repair" and res.skip_layers == list(SKIP)

    at = page("sweeps")  # the ratio sweep: 20-29 is stored, the other ratios would be fitted
    assert not at.checkbox(key="sw.repair").disabled
    at.checkbox(key="sw.repair").check().run()
    assert "Layers 24-29; 22-29; 18-29; 15-29; 12-29 have no stored repair yet" in said(at.caption)
    at.selectbox(key="sw.kind").set_value("ablation").run()  # the paper's third: stored
    assert not at.checkbox(key="sw.repair").disabled and "no stored repair" not in said(at.caption)
    assert page("serve").radio(key="serve.variant").options == serves("pop", "pop_repair", "full")


def test_a_repair_of_another_skip_set_is_not_offered():
    at = page("generate", range(21, 30))
    assert LABEL not in at.selectbox(key="gen.variant").options
    assert page("serve", range(21, 30)).radio(key="serve.variant").options == serves("pop", "full")
