"""One path rule for every way in: local paths are read only under the allowed folders, links resolved first, hidden files refused, and a refusal reads the same whether or not the path exists."""
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pop_analysis.data.allowed_paths import (
    ENV,
    PathNotAllowed,
    check_model,
    check_path,
    check_source,
)

ROOT = Path(__file__).resolve().parents[2]




def test_allowed_folders_and_refusals(allowed_cache, outside_folder, monkeypatch):
    inside = allowed_cache / "prompts.jsonl"
    inside.write_text('{"prompt": "hi"}\n')
    assert check_path(str(inside)) == inside.resolve()
    assert check_path("README.md") == (ROOT / "README.md").resolve()  # the working directory
    shared = ROOT.parent / "shared" / "data" / "gsm8k_test.jsonl"
    assert check_path(str(shared)) == shared.resolve()
    for bad in ("/etc/passwd", str(outside_folder / "secrets.json"), str(allowed_cache / ".." / "elsewhere"),
                ".git/config", str(allowed_cache / ".hidden.jsonl")):
        with pytest.raises(PathNotAllowed, match="not a file the dashboard may read"):
            check_path(bad)
    monkeypatch.setenv(ENV, f"/nonexistent{os.pathsep}{outside_folder}")  # the user's own folder
    assert check_path(str(outside_folder / "secrets.json")) == (outside_folder / "secrets.json").resolve()


def test_refusal_reads_the_same_whether_or_not_the_file_exists(allowed_cache, outside_folder):
    messages = []
    for name in ("secrets.json", "nothing.json"):
        with pytest.raises(PathNotAllowed) as e:
            check_path(str(outside_folder / name))
        messages.append(str(e.value).replace(name, "X"))
    assert messages[0] == messages[1]


def test_a_symlink_to_a_system_file_is_refused(allowed_cache):
    link = allowed_cache / "uploads" / "data.txt"
    link.parent.mkdir()
    link.symlink_to("/etc/passwd")
    with pytest.raises(PathNotAllowed):
        check_path(str(link))
    from dashboard.session.cached import prompt_set

    with pytest.raises(PathNotAllowed):
        prompt_set(str(link))


def test_names_and_hub_sources_pass(allowed_cache):
    for name in ("builtin", "gsm8k", "retrieval:512", "hf:openai/gsm8k:main:test"):
        assert check_source(name) == name


def test_peek_fields_shows_nothing_of_files_outside(allowed_cache, outside_folder):
    from dashboard.session.cached import peek_fields

    for name in ("secrets.json", "secrets.csv"):
        assert peek_fields(str(outside_folder / name)) == []
        (allowed_cache / name).write_bytes((outside_folder / name).read_bytes())
        assert "aws_secret_access_key" in peek_fields(str(allowed_cache / name))  # inside: allowed


def test_upload_errors_name_the_users_file(allowed_cache):
    from dashboard.panels.widgets import save_upload
    from dashboard.session.cached import prompt_set
    from pop_analysis.data.prompts import DatasetError

    bad = save_upload("my prompts.csv", b'prompt\nfine\n"never closed\n')
    with pytest.raises(DatasetError) as e:
        prompt_set(bad)
    assert str(e.value).startswith("my prompts.csv line 3: a quoted field")
    assert "uploads" not in str(e.value) and str(allowed_cache) not in str(e.value)
    good = save_upload("../../evil name.jsonl", b'{"prompt": "hello"}\n')
    assert Path(good).parent.parent == allowed_cache / "uploads" and Path(good).name == "evil name.jsonl"
    assert prompt_set(good).name == "evil name.jsonl"


FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=80)


@FAST
@given(name=TEXT)
def test_any_model_parameter_is_allowed_or_refused_in_one_line(name):
    try:
        assert check_model(name) == name  # passes unchanged: the loader gets what was linked
    except PathNotAllowed as e:
        assert "\n" not in str(e) and "is not a file the dashboard may read" in str(e)


@FAST
@given(tail=st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=30),
       exists=st.booleans())
def test_a_refusal_never_tells_whether_the_path_exists(tmp_path_factory, tail, exists):
    root = tmp_path_factory.getbasetemp() / "outside_properties"  # no allowed folder
    root.mkdir(exist_ok=True)
    path = root / tail
    if exists:
        path.mkdir(exist_ok=True)
    with pytest.raises(PathNotAllowed) as e:
        check_model(str(path))
    assert str(e.value).replace(repr(str(path)), "P") == str(
        pytest.raises(PathNotAllowed, check_model, str(root / "never-there")).value
    ).replace(repr(str(root / "never-there")), "P")
