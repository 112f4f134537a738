"""Bombs in data files: every reader is bounded by rows and bytes per row before it decompresses or expands, with one line naming the file and the row; generated bombs of each format (Parquet dictionary and plain pages, JSON, CSV), uploads and hub data sets, each read in a child process whose peak memory stays under 1 GiB."""
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pop_analysis.data.prompts import load_prompts
from pop_analysis.data.readers import DatasetError

GIB = 1 << 30
MIB = 1 << 20
# One child process reads every bomb in turn; its peak memory (VmHWM) is reset before each
# (/proc/self/clear_refs), so each file's figure is its own: the peak above what the process held
# before it.
READ = """
import json, re, sys, time
from pop_analysis.data.prompts import load_prompts

def peak():
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read())[1]) * 1024

for label, path, limit in json.loads(sys.argv[1]):
    open("/proc/self/clear_refs", "w").write("5")
    base, t0 = peak(), time.perf_counter()
    try:
        line = f"loaded {len(load_prompts(path, limit=limit))}"
    except Exception as e:
        line = f"{type(e).__name__}: {e}"
    print(json.dumps([label, line, time.perf_counter() - t0, peak() - base]), flush=True)
"""


def dictionary_bomb(path: Path, value_bytes: int = 20 * MIB, rows: int = 200) -> Path:
    """One long value in a dictionary page, referenced by every row: a few KB on disk, rows x
    value_bytes decoded."""
    index = pa.array([0] * rows, pa.int32())
    column = pa.DictionaryArray.from_arrays(index, pa.array(["a" * value_bytes]))
    pq.write_table(pa.table({"prompt": column}), path, compression="zstd")
    return path


def plain_bomb(path: Path) -> Path:
    """270 MiB of plain pages in one row group (9 rows of 30 MiB), ~10 KB on disk."""
    schema = pa.schema([("prompt", pa.string()), ("id", pa.int64())])
    with pq.ParquetWriter(path, schema, compression="zstd", compression_level=1,
                          use_dictionary=False) as w:
        rows = pa.table({"prompt": ["b" * (30 * MIB)] * 3, "id": [1, 2, 3]}, schema=schema)
        w.write_table(pa.concat_tables([rows] * 3), row_group_size=9)
    return path


LIST_BYTES = 4 * MIB  # the JSON bomb's size; its growth per byte is what the bound multiplies


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bombs")
    lists = folder / "lists.jsonl"  # '[],' x 1.4M: the most Python objects per byte of JSON
    lists.write_text('{"prompt": "x", "pad": [' + ",".join(["[]"] * (LIST_BYTES // 3)) + "]}\n")
    return {"dict": (dictionary_bomb(folder / "dict.parquet"), 8),  # 4 GB decoded
            "plain": (plain_bomb(folder / "plain.parquet"), 8),
            "lists": (lists, 1)}


@pytest.fixture(scope="module")
def read_in_child(bombs):
    """label -> (the outcome line, seconds, peak bytes above the process before it), of
    load_prompts in one child process whose address space is capped at 4 GiB (a regression
    fails instead of filling the machine)."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (4 * GIB, 4 * GIB))
    todo = json.dumps([[k, str(path), limit] for k, (path, limit) in bombs.items()])
    out = subprocess.run([sys.executable, "-c", READ, todo], capture_output=True, text=True,
                         timeout=300, preexec_fn=cap)
    got = {k: tuple(v) for k, *v in map(json.loads, out.stdout.splitlines())}
    assert out.returncode == 0 and set(got) == set(bombs), out.stdout + out.stderr[-2000:]
    return got


def test_a_parquet_dictionary_bomb_is_refused_at_its_first_row(bombs, read_in_child):
    path = bombs["dict"][0]
    assert path.stat().st_size < 10_000
    line, seconds, peak = read_in_child["dict"]
    assert line == f"DatasetError: {path} row 1: longer than 16 MiB; no prompt is that long"
    assert peak < GIB and seconds < 30, (peak / MIB, seconds)


def test_rows_within_the_bound_stop_at_the_text_budget(tmp_path, monkeypatch):
    """Rows of 1 MiB from one dictionary value (20 GB decoded in all), the budget lowered to 8 MiB
    so that the test decodes megabytes."""
    from pop_analysis.data import readers

    monkeypatch.setattr(readers, "MAX_PARQUET_TEXT", 8 * MIB)
    path = dictionary_bomb(tmp_path / "many.parquet", MIB, 20_000)
    with pytest.raises(DatasetError, match=r"many\.parquet row 8: the rows read hold more than "
                                           "8 MiB; ask for fewer rows"):  # 8 x (1 MiB + offsets)
        load_prompts(str(path), limit=1000)
    assert len(load_prompts(str(path), limit=7)) == 7


def test_a_row_group_beyond_the_bound_is_refused_from_its_metadata(bombs, read_in_child):
    path = bombs["plain"][0]
    assert path.stat().st_size < 100_000
    line, seconds, peak = read_in_child["plain"]
    assert line == (f"DatasetError: {path} row group 1: 270 MiB uncompressed in column(s) "
                    "prompt, more than the 256 MiB read at once; rewrite it with smaller row "
                    "groups")
    assert peak < 64 * MIB and seconds < 30, (peak / MIB, seconds)  # nothing decompressed


def test_a_json_record_grows_at_most_32_fold_so_the_line_bound_keeps_it_under_a_gigabyte(
        read_in_child):
    from pop_analysis.data.readers import MAX_LINE_BYTES

    line, seconds, peak = read_in_child["lists"]
    assert line == "loaded 1", line
    assert peak < 32 * LIST_BYTES and 32 * MAX_LINE_BYTES <= 512 * MIB, peak / LIST_BYTES


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_json_integer_of_too_many_digits_names_the_file_and_line(tmp_path, suffix):
    path = tmp_path / f"digits{suffix}"
    record = '{"prompt": "hi", "n": ' + "9" * 5000 + "}"
    path.write_text(f"[\n{record}]" if suffix == ".json" else f'{{"prompt": "a"}}\n{record}\n')
    with pytest.raises(DatasetError, match=rf"digits\{suffix} line 2: invalid JSON \(Exceeds the "
                                           r"limit \(4300 digits\)[^;]*\)$"):
        load_prompts(str(path))


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_record_of_50000_fields_gets_a_short_line(tmp_path, suffix):
    path = tmp_path / f"keys{suffix}"
    names = [f"k{i}" for i in range(50_000)]
    if suffix == ".csv":
        path.write_text(",".join(names) + "\n" + ",".join("x" * len(names)) + "\n")
    else:
        path.write_text(json.dumps(dict.fromkeys(names, 1)) + "\n")
    with pytest.raises(DatasetError) as e:
        load_prompts(str(path))
    assert "no prompt field found among ['k0', 'k1', " in str(e.value), str(e.value)[:300]
    assert "(50000 in all)" in str(e.value) and len(str(e.value)) < 400


def test_an_uploaded_parquet_bomb_is_refused_in_one_line(tmp_path, monkeypatch, bombs):
    from dashboard.panels.widgets import save_upload
    from dashboard.session.cached import prompt_set

    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path / "cache"))
    bomb = bombs["dict"][0].read_bytes()
    path = save_upload("my prompts.parquet", bomb)
    t0 = time.perf_counter()
    with pytest.raises(DatasetError) as e:
        prompt_set(path, limit=8)
    assert str(e.value) == "my prompts.parquet row 1: longer than 16 MiB; no prompt is that long"
    assert time.perf_counter() - t0 < 30


def small_bomb(path: Path) -> Path:
    return dictionary_bomb(path, 17 * MIB, 4)  # just over the row bound


def hub_export(root: Path, name: str, files: dict) -> None:
    """The layout of the hub's Parquet export (datasets/NAME@refs%2Fconvert%2Fparquet/...)."""
    for rel, table in files.items():
        path = root / "datasets" / f"{name}@refs%2Fconvert%2Fparquet" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path) if isinstance(table, pa.Table) else table(path)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A local folder served as the hub's filesystem; records the files opened."""
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    import pop_analysis.data.hub_data as hub_data

    opened = []

    class Recording(DirFileSystem):
        def open(self, path, *a, **k):
            opened.append(path.rsplit("/", 1)[-1])
            return super().open(path, *a, **k)

    monkeypatch.setattr(hub_data, "hub_filesystem",
                        lambda: Recording(path=str(tmp_path), fs=LocalFileSystem()))
    monkeypatch.setattr("pop_analysis.data.prompts.unreachable_reason", lambda: None)
    monkeypatch.setattr("pop_analysis.quality.evalsets.unreachable_reason", lambda: None)
    return tmp_path, opened


def test_a_hub_data_set_is_read_by_the_bounded_reader(hub):
    root, opened = hub
    rows = lambda a, b: pa.table({"question": [f"q{i}" for i in range(a, b)],  # noqa: E731
                                  "answer": ["#### 1"] * (b - a)})
    hub_export(root, "openai/gsm8k", {"main/test/0000.parquet": rows(0, 5),
                                      "main/test/0001.parquet": rows(5, 10),
                                      "socratic/test/0000.parquet": rows(0, 1)})
    s = load_prompts("hf:openai/gsm8k:main:test", limit=3)
    assert s.prompts == ("q0", "q1", "q2") and s.name == "hf:openai/gsm8k:main:test"
    assert opened == ["0000.parquet"]  # the second file is never fetched
    assert len(load_prompts("hf:openai/gsm8k:main:test", limit=7)) == 7
    with pytest.raises(DatasetError, match=r"hf:openai/gsm8k:test: name a config, "
                                           r"hf:openai/gsm8k:CONFIG:test \(configs: \['main', "):
        load_prompts("hf:openai/gsm8k:test", limit=2)
    with pytest.raises(DatasetError,
                       match=r"no split 'train' in config 'main' \(splits: \['test'\]"):
        load_prompts("hf:openai/gsm8k:main:train", limit=2)


def test_a_bomb_on_the_hub_is_refused_before_it_is_fetched_whole(hub):
    root, _ = hub
    hub_export(root, "owner/set", {"default/train/0000.parquet": small_bomb})
    with pytest.raises(DatasetError, match=r"hf:owner/set 0000\.parquet row 1: longer than 16 MiB"):
        load_prompts("hf:owner/set", limit=2)


def test_a_hub_evaluation_set_reads_only_the_rows_asked_for(hub):
    from pop_analysis.quality.evalsets import _hf_records

    root, opened = hub
    hub_export(root, "openai/gsm8k", {
        "main/test/0000.parquet": pa.table({"question": ["q0", "q1"], "answer": ["#### 1"] * 2,
                                            "other": ["x", "y"]}),
        "main/test/0001.parquet": small_bomb})
    assert _hf_records("hf:openai/gsm8k", 2) == [{"question": "q0", "answer": "#### 1"},
                                                  {"question": "q1", "answer": "#### 1"}]
    assert opened == ["0000.parquet"]
