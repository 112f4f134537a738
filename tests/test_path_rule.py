"""One path rule for every way in (issue 22): a dashboard link (?model=...), the model box, the
path box and uploads go through pop_analysis's allowed-path check, and a refusal reads the same
whether or not the path exists (so nothing can probe the machine's files)."""
import pytest
from streamlit.testing.v1 import AppTest

from apptest_util import APP, temp_store, texts  # noqa: F401 (fixture)
from pop_analysis.data.allowed_paths import PathNotAllowed
from tiny import tiny_model

REFUSED = "is not a file the dashboard may read"


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A loadable model folder outside every allowed folder, and a path beside it that is not."""
    d = tmp_path_factory.mktemp("elsewhere")
    tiny_model("llama").model.save_pretrained(d / "model")
    return d / "model", d / "nothing"


def linked(model: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["model"] = model
    return at.run()


def loads_of(name: str) -> list:
    from dashboard.resources import load_log

    return [entry for entry in load_log() if entry[0] == name]


def errors(at: AppTest) -> str:
    return texts(list(at.sidebar.error) + list(at.error) + list(at.warning))


def test_a_link_cannot_load_a_model_from_outside_the_allowed_folders(outside):
    model, _ = outside
    at = linked(str(model))
    assert not at.exception, [e.value for e in at.exception]
    assert loads_of(str(model)) == [], "the link loaded a model from outside the allowed folders"
    assert REFUSED in errors(at), errors(at)
    assert at.session_state["lab.model"].name == "smollm2-135m", "the default model is kept"


def test_a_links_refusal_reads_the_same_for_a_missing_and_an_existing_path(outside):
    model, nothing = outside
    shown = [errors(linked(str(p))).replace(str(p), "PATH") for p in (model, nothing)]
    assert REFUSED in shown[0] and shown[0] == shown[1], shown


def test_the_model_box_refuses_with_the_links_words(outside):
    model, _ = outside
    at = AppTest.from_file(APP, default_timeout=300).run()
    at.radio(key="w.model_source").set_value("Local directory")
    at.text_input(key="w.model_name").set_value(str(model))
    next(b for b in at.button if b.label == "Load model").click().run()
    assert loads_of(str(model)) == []
    box, link = errors(at), errors(linked(str(model)))
    reason = box[box.index(repr(str(model))):].splitlines()[0]  # from the path on: the rule's words
    assert REFUSED in reason and reason in link, (box, link)


def test_check_model_passes_the_registry_hub_ids_and_allowed_folders(outside, temp_store):  # noqa: F811
    from pop_analysis.data.allowed_paths import check_model

    model, nothing = outside
    assert check_model("smollm2-135m") == "smollm2-135m"
    assert check_model("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"  # a hub id names no local file
    inside = temp_store / "my-model"  # a model folder in the cache
    inside.mkdir(exist_ok=True)
    assert check_model(str(inside)) == str(inside)
    for bad in (str(model), str(nothing), "/etc", "../../etc", "~/.ssh"):
        with pytest.raises(PathNotAllowed, match=REFUSED):
            check_model(bad)
