"""Property tests (Hypothesis) for the link parameters and the size bounds (issue 22): whatever a
link or a file holds, the answer is a usable value or one refusal line, and every bound refuses
exactly what lies beyond it."""
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pop_analysis.data.allowed_paths import PathNotAllowed, check_model
from pop_analysis.engine.pop import PromptError, check_text, max_prompt_chars
from pop_analysis.data.readers import DatasetError, text_lines
from pop_analysis.engine.skipset import SkipSetError

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


@FAST
@given(text=TEXT)
def test_any_skip_parameter_parses_or_is_refused(text):
    from dashboard.links import parse_skip

    try:
        layers = parse_skip(text)
    except SkipSetError:
        return
    assert all(isinstance(i, int) and i >= 0 for i in layers) and list(layers) == sorted(set(layers))


class Shape:
    def __init__(self, max_positions):
        self.max_positions = max_positions


class Adapter:
    def __init__(self, max_positions):
        self.shape = Shape(max_positions)


@FAST
@given(context=st.integers(0, 1 << 20), chars=st.integers(0, 1 << 25))
def test_the_prompt_bound_refuses_exactly_what_the_context_cannot_hold(context, chars):
    adapter = Adapter(context)
    limit = max_prompt_chars(adapter)
    assert limit is None if context == 0 else limit == 16 * context
    if limit is not None and chars > limit:
        with pytest.raises(PromptError, match=f"{chars} characters"):
            check_text(adapter, chars)
    else:
        check_text(adapter, chars)


@FAST
@given(lines=st.lists(st.integers(0, 300), min_size=1, max_size=8), cap=st.integers(1, 200))
def test_a_line_is_read_whole_when_it_fits_and_refused_when_it_does_not(tmp_path_factory, lines,
                                                                       cap):
    path = Path(tmp_path_factory.mktemp("lines")) / "f.txt"
    path.write_bytes(b"".join(b"a" * n + b"\n" for n in lines))
    got = []
    try:
        for n, text in text_lines(path, "f.txt", max_line_bytes=cap):
            got.append(len(text.rstrip("\n")))
    except DatasetError as e:
        first_long = next(i for i, n in enumerate(lines) if n + 1 > cap)
        assert f"f.txt line {first_long + 1}: longer than" in str(e)
        assert got == lines[:first_long]
        return
    assert got == lines and all(n + 1 <= cap for n in lines)
    os.unlink(path)
