"""Property tests (Hypothesis) of every parser and stored record: any input either works or raises the project's one-line error type, never another exception."""
import argparse
import contextlib
import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pop_analysis.commands import calibrate as calibrate_command
from pop_analysis.commands import drift as drift_command
from pop_analysis.commands._common import LAYER_LIST, NumList, core_list
from pop_analysis.commands.generate import TOKEN_ID
from pop_analysis.data import readers
from pop_analysis.data.prompts import SUFFIXES, load_prompts
from pop_analysis.engine.generate import SamplingConfig
from pop_analysis.engine.skipset import parse_layers, resolve
from pop_analysis.errors import InputError
from pop_analysis.experiments.sweep import SweepResult, write_csv
from pop_analysis.importance.calibrate import (
    CalibrationConfig,
    CalibrationResult,
    calibrate_ids,
    suggest_skip,
)
from pop_analysis.inspection.drift import DriftConfig, DriftResult, average, drift
from pop_analysis.store import results as store
from pop_analysis.store.schema import SweepRow
from pop_vllm.run_setting import RunSetting, SettingError

from tiny import tiny_model, tiny_prompt

# POP_LAB_PROPERTY_SCALE=20 explores 20x more (random) examples; the suite's runs are the same
# derandomised examples every time.
SCALE = int(os.environ.get("POP_LAB_PROPERTY_SCALE", "1"))


def one_line(e: BaseException) -> None:
    """The project's error contract: an InputError with one short, non-empty line."""
    assert isinstance(e, InputError), f"{type(e).__name__}: {e}"
    text = str(e)
    assert text.strip() and "\n" not in text and len(text) < 600, text


@contextlib.contextmanager
def works_or_one_line():
    try:
        yield
    except InputError as e:
        one_line(e)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


LAYER_TEXT = st.from_regex(r"[0-9 ,\-]{0,24}", fullmatch=True) | st.text(max_size=24)


@given(text=LAYER_TEXT, n=st.integers(1, 64))
def test_skip_text_gives_a_valid_set_or_one_line(text, n):
    with works_or_one_line():
        layers = resolve(n, layers=text)
        assert list(layers) == sorted(set(layers)) and all(0 <= i < n for i in layers)
        assert len(layers) < n


@given(lo=st.integers(0, 10 ** 15), hi=st.integers(0, 10 ** 15), n=st.integers(1, 64))
def test_a_range_is_exactly_its_layers_or_refused(lo, hi, n):
    try:
        assert parse_layers(f"{lo}-{hi}", n) == tuple(range(lo, hi + 1))
        assert lo <= hi < n
    except InputError as e:
        one_line(e)
        assert hi < lo or hi >= n


@given(ratio=st.floats(allow_nan=True, allow_infinity=True), n=st.integers(1, 64))
def test_skip_ratio_gives_a_tail_or_one_line(ratio, n):
    with works_or_one_line():
        layers = resolve(n, ratio=ratio)
        assert layers == tuple(range(n - len(layers), n)) and len(layers) < n


@contextlib.contextmanager
def parsed_or_one_flag_line():
    """An argparse type's contract: a value, or an ArgumentTypeError of one short line."""
    try:
        yield
    except argparse.ArgumentTypeError as e:
        assert str(e).strip() and "\n" not in str(e) and len(str(e)) < 300, str(e)


@given(text=st.from_regex(r"[0-9 ,\-e.]{0,30}", fullmatch=True) | st.text(max_size=30))
def test_prompt_ids_parse_or_one_line(text):
    with parsed_or_one_flag_line():
        ids = NumList(TOKEN_ID)(text)
        assert ids and all(isinstance(i, int) and i >= 0 for i in ids)


@given(ids=st.lists(st.integers(0, 2 ** 31 - 1), min_size=1, max_size=20),
       sep=st.sampled_from([",", ", ", " ,", ",,"]))
def test_prompt_ids_round_trip(ids, sep):
    assert NumList(TOKEN_ID)(sep.join(map(str, ids))) == ids


@given(text=st.from_regex(r"[0-9 ,\-]{0,24}", fullmatch=True) | st.text(max_size=24))
def test_core_and_layer_lists_parse_or_one_line(text):
    for kind in (core_list(), LAYER_LIST):
        with parsed_or_one_flag_line():
            got = kind(text)
            assert list(got) == sorted(set(got)) and all(0 <= i < kind.bound for i in got)


@given(lo=st.integers(0, 10 ** 15), hi=st.integers(0, 10 ** 15))
def test_a_core_range_is_exactly_its_cores_or_refused(lo, hi):
    cores = core_list()
    try:
        assert cores(f"{lo}-{hi}") == tuple(range(lo, hi + 1)) and lo <= hi < cores.bound
    except argparse.ArgumentTypeError as e:
        assert hi < lo or hi >= cores.bound, e


ANY = (st.none() | st.booleans() | st.integers(-10, 10 ** 20) | st.text(max_size=4)
       | st.floats(allow_nan=True, allow_infinity=True))


@given(max_new=ANY, temperature=ANY, top_p=ANY, seed=ANY)
def test_sampling_parameters_are_valid_or_one_line(max_new, temperature, top_p, seed):
    with works_or_one_line():
        cfg = SamplingConfig(max_new_tokens=max_new, temperature=temperature, top_p=top_p,
                             seed=seed)
        assert cfg.max_new_tokens >= 1 and math.isfinite(cfg.temperature) and cfg.temperature >= 0
        assert 0 < cfg.top_p <= 1 and 0 <= cfg.seed < 2 ** 63


@pytest.fixture(scope="module")
def folder():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def load_file(folder: Path, suffix: str, content: bytes, limit):
    path = folder / f"data{suffix}"
    path.write_bytes(content)
    with works_or_one_line():
        s = load_prompts(str(path), limit=limit)
        assert 0 < len(s) <= (limit or len(s)) and all(isinstance(p, str) and p for p in s.prompts)


LIMIT = st.none() | st.integers(1, 4)


@settings(max_examples=150 * SCALE, deadline=None)  # the first Parquet example imports pyarrow
@given(content=st.binary(max_size=300), suffix=st.sampled_from(SUFFIXES), limit=LIMIT)
def test_random_bytes_as_a_data_file(folder, content, suffix, limit):
    load_file(folder, suffix, content, limit)


@settings(deadline=None)  # a busy machine's first example took 435 ms
@given(doc=JSON | st.lists(st.dictionaries(st.sampled_from(["prompt", "question", "messages",
                                                            "x"]), JSON, max_size=3), max_size=4),
       limit=LIMIT, field=st.none() | st.sampled_from(["prompt", "x"]))
def test_random_json_as_a_data_file(folder, doc, limit, field):
    text = json.dumps(doc)
    for suffix, content in ((".json", text), (".jsonl", "\n".join(
            json.dumps(x) for x in (doc if isinstance(doc, list) else [doc])))):
        path = folder / f"data{suffix}"
        path.write_text(content, encoding="utf-8")
        with works_or_one_line():
            s = load_prompts(str(path), field=field, limit=limit)
            assert all(isinstance(p, str) and p.strip() for p in s.prompts)


@given(rows=st.lists(st.lists(st.text(max_size=8), max_size=4), max_size=5),
       header=st.lists(st.sampled_from(["prompt", "text", "id", ""]), max_size=3), limit=LIMIT,
       tail=st.sampled_from(["", '"', "\x00", "a,b,c,d,e,f\n"]))
def test_random_csv_as_a_data_file(folder, rows, header, limit, tail):
    buf = io.StringIO()
    csv.writer(buf).writerows([header, *rows])
    load_file(folder, ".csv", (buf.getvalue() + tail).encode("utf-8"), limit)


@settings(deadline=None)  # 446 ms for one example on a busy machine (a 200 ms deadline failed)
@given(items=st.lists(JSON, max_size=6), wrap=st.booleans(), chunk=st.integers(1, 9),
       indent=st.none() | st.integers(0, 2))
def test_streamed_json_lists_read_back_exactly(folder, items, wrap, chunk, indent):
    """Tiny read chunks cut values anywhere: the streaming reader still returns each item."""
    doc = {"meta": "x", "records": items, "n": 1} if wrap else items
    path = folder / "stream.json"
    path.write_text(json.dumps(doc, indent=indent), encoding="utf-8")
    old, readers.CHUNK = readers.CHUNK, chunk
    try:
        got = [rec for _, rec in readers.json_records(path)]
    finally:
        readers.CHUNK = old
    assert json.dumps(got) == json.dumps(items)  # NaN-safe equality


@pytest.fixture(scope="module")
def records():
    """A real record of each kind (tiny models, 6 layers) and a temporary store."""
    old = os.environ.get("POP_LAB_CACHE")
    with tempfile.TemporaryDirectory() as d:
        os.environ["POP_LAB_CACHE"] = d
        lm = tiny_model("llama")
        cal = calibrate_ids(lm, [tiny_prompt(5, seed=1), tiny_prompt(7, seed=2)],
                            CalibrationConfig(n_samples=2, max_new_tokens=2, batch_size=2))
        dr = drift(lm, tiny_prompt(9), RunSetting((4, 5)), DriftConfig(decode_steps=2))
        row = SweepRow("pop", 1 / 3, [4, 5], 1.2, 1.4, float("nan"), 0.9, kind="ratio", n=2)
        sw = SweepResult("tiny-llama", "ratio", [row.to_dict(), SweepRow(
            "full", 0.0, [], 1.0, 1.0, 2.5, 1.0).to_dict()], {}, 3.0)
        yield {"calibration": (CalibrationResult, cal.to_dict()),
               "drift": (DriftResult, dr.to_dict()), "sweep": (SweepResult, sw.to_dict())}
    if old is None:
        os.environ.pop("POP_LAB_CACHE", None)
    else:
        os.environ["POP_LAB_CACHE"] = old


KEY = store.make_key({"property": "test"})


def write_entry(kind: str, payload) -> None:
    """An entry as the store writes it, with any JSON as payload (NaN and Infinity included)."""
    path = store.results_dir(kind) / f"{KEY}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"kind": kind, "key": KEY, "version": "x", "saved_at": 1.0, "params": {},
             "payload": payload}
    path.write_text(json.dumps(entry), encoding="utf-8")


def load_and_use(kind: str, cls, n_layers: int = 6):
    """Load through the store's check; what comes back must survive the code that reads it."""
    notes = []
    result = store.load_record(kind, KEY, cls, n_layers, notice=notes.append)
    if result is None:
        assert len(notes) <= 1 and all("\n" not in n for n in notes)
        return None
    assert notes == []
    with contextlib.redirect_stdout(io.StringIO()):
        USE[kind](result)
    return result


def use_calibration(r):
    calibrate_command.report(r, True, suggest_skip(r))
    [(r.prefill[i], r.decode[i], r.prefill_std[i], r.decode_std[i]) for i in range(r.n_layers)]


def use_drift(r):
    drift_command._print(r, [])
    drift_command._payload(r, [])
    average([r, r]).block_means()


def use_sweep(r):
    from pop_analysis.commands.sweep import _print

    _print(r, True)
    write_csv(r, io.StringIO())


USE = {"calibration": use_calibration, "drift": use_drift, "sweep": use_sweep}


KINDS = st.sampled_from(["calibration", "drift", "sweep"])


@settings(max_examples=80 * SCALE, deadline=None)
@given(kind=KINDS, payload=JSON)
def test_random_json_in_place_of_a_record(records, kind, payload):
    write_entry(kind, payload)
    assert load_and_use(kind, records[kind][0]) is None or isinstance(payload, dict)


@settings(max_examples=40 * SCALE, deadline=None)
@given(kind=KINDS, content=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()))
def test_random_bytes_in_place_of_an_entry_file(records, kind, content):
    path = store.results_dir(kind) / f"{KEY}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    assert load_and_use(kind, records[kind][0]) is None
    store.entries(kind)  # the listing skips it without raising


@settings(max_examples=200 * SCALE, deadline=None)  # 0.9 s on a busy machine
@given(kind=KINDS, data=st.data())
def test_one_field_replaced_by_random_json(records, kind, data):
    cls, valid = records[kind]
    payload = json.loads(json.dumps(valid))
    name = data.draw(st.sampled_from(sorted(payload)))
    payload[name] = data.draw(JSON)
    if kind == "sweep" and data.draw(st.booleans()):  # or a field of one of its rows
        row = payload["rows"] = [dict(r) for r in valid["rows"]]
        row[0][data.draw(st.sampled_from(sorted(row[0])))] = data.draw(JSON)
    write_entry(kind, payload)
    load_and_use(kind, cls)


def test_the_valid_records_load(records):
    for kind, (cls, valid) in records.items():
        write_entry(kind, valid)
        assert load_and_use(kind, cls) is not None, kind


FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=80)


@FAST
@given(text=TEXT)
def test_any_skip_parameter_parses_or_is_refused(text):
    from dashboard.session.links import parse_skip

    try:
        layers = parse_skip(text)
    except SettingError:
        return
    assert all(isinstance(i, int) and i >= 0 for i in layers) and list(layers) == sorted(set(layers))
