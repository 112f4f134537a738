"""Every input is bounded before it is expanded: files are read only as far as the run needs, a line longer than the bound is refused while reading, uploads are capped, a prompt longer than the context is refused before tokenising."""
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pop_analysis.data.prompts import load_prompts
from pop_analysis.data.readers import DatasetError, text_lines
from pop_analysis.engine.pop import PromptError, check_text, max_prompt_chars

ROOT = Path(__file__).resolve().parents[2]


def test_a_huge_one_line_prompt_file_is_refused_while_reading(tmp_path):
    from pop_analysis.data.readers import MAX_LINE_BYTES

    big = tmp_path / "one_line.txt"
    with open(big, "wb") as f:
        f.write(b"word " * ((MAX_LINE_BYTES // 5) + 1000))  # one line, just over the bound
    t0 = time.perf_counter()
    with pytest.raises(DatasetError, match=r"one_line.txt line 1: longer than 16 MiB"):
        load_prompts(str(big))
    assert time.perf_counter() - t0 < 5


def test_the_dashboard_caps_uploads_at_a_useful_size():
    import tomllib

    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["maxUploadSize"] == 32  # MB: a prompt file, not a whole corpus


SPARSE = 200 * 2 ** 20  # a 200 MB file that takes no disk (sparse): NUL bytes after the records


def sparse_file(path, head: str):
    with open(path, "wb") as f:
        f.write(head.encode())
        f.truncate(SPARSE)
    return path


@pytest.mark.parametrize("name, head", [
    ("big.jsonl", '{"prompt": "one"}\n{"prompt": "two"}\n'),
    ("big.json", '[{"prompt": "one"}, {"prompt": "two"}, '),
    ("big.csv", "prompt,id\none,1\ntwo,2\n"),
    ("big.txt", "one\ntwo\n"),
])
def test_readers_stop_after_the_prompts_needed(tmp_path, name, head):
    """The rest of each file is 200 MB of NUL bytes, which no reader accepts: reading 2 prompts
    succeeds only if the reader stops after them."""
    path = sparse_file(tmp_path / name, head)
    assert load_prompts(str(path), limit=2).prompts == ("one", "two")
    with pytest.raises(DatasetError, match=name.replace(".", r"\.")):
        load_prompts(str(path), limit=3)


@pytest.mark.parametrize("name, head", [
    ("big.jsonl", '{"question": "one"}\n{"question": "two"}\n'),
    ("big.json", '[{"question": "one"}, {"question": "two"}, '),
    ("big.txt", "one\ntwo\n"),
])
def test_evaluation_reads_stop_after_the_items_needed(tmp_path, name, head):
    from pop_analysis.quality.evalsets import read_records
    from pop_analysis.quality.items import EvalDataError

    path = sparse_file(tmp_path / name, head)
    assert [r.get("question", r.get("prompt")) for r in read_records(path, 2)] == ["one", "two"]
    with pytest.raises(EvalDataError, match=name.replace(".", r"\.")):
        read_records(path, 3)


def test_unterminated_csv_quote_names_the_file_and_line(tmp_path):
    path = tmp_path / "quoted.csv"
    path.write_text('prompt,id\nfine,1\n"never closed,2\nthree,3\nfour,4\n')
    with pytest.raises(DatasetError, match=r"quoted\.csv line 3: a quoted field opened here is "
                                           "never closed"):
        load_prompts(str(path))
    assert load_prompts(str(path), limit=1).prompts == ("fine",)  # before the bad line: fine


FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


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
