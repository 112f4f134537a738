"""Every bench script writes its raw output through bench/bench_results.py: one new file per run
under bench/raw/<script>/, named by the run's parameters, never an existing file (a 4-turn load
test once overwrote the 6-turn raw file behind a docs figure)."""
import argparse
import ast
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_results", ROOT / "bench" / "bench_results.py")
bench_results = importlib.util.module_from_spec(_spec)  # bench/ is scripts, not a package
_spec.loader.exec_module(bench_results)



def test_two_runs_with_the_same_parameters_never_share_a_file(tmp_path):
    args = argparse.Namespace(part="prefix", turns=6, rounds=3, kv_dir="/dev/shm/x", lengths=[1, 2])
    first = bench_results.RawFile("disagg_bench", args, what="prefix", folder=tmp_path)
    second = bench_results.RawFile("disagg_bench", args, what="prefix", folder=tmp_path)
    assert first.path != second.path and first.path.parent == tmp_path / "disagg_bench"
    first.write({"turns": 6})
    second.write({"turns": 6, "again": True})
    assert json.loads(first.path.read_text()) == {"turns": 6}  # the first run's file kept
    assert first.path.name.startswith("prefix__") and "turns=6" in first.path.name
    assert "lengths=1+2" in first.path.name and "/" not in first.path.name.split("__")[1]


def test_other_parameters_other_names_and_a_bounded_name(tmp_path):
    four = bench_results.RawFile("disagg_bench", {"part": "prefix", "turns": 4}, folder=tmp_path)
    six = bench_results.RawFile("disagg_bench", {"part": "prefix", "turns": 6}, folder=tmp_path)
    assert "turns=4" in four.path.name and "turns=6" in six.path.name
    long = bench_results.RawFile("x", {"data": "y" * 500}, folder=tmp_path)
    assert len(long.path.name) < 220 and "~" in long.path.name  # cut, with a digest of it all
    other = bench_results.RawFile("x", {"data": "y" * 499 + "z"}, folder=tmp_path)
    assert other.path.name.split("~")[1][:10] != long.path.name.split("~")[1][:10]


def test_a_run_rewrites_only_its_own_file_and_reports_read_the_newest(tmp_path):
    run = bench_results.RawFile("heal_bench", {"tokens": 512}, what="quality", folder=tmp_path)
    run.write({"n": 4})
    run.write({"n": 8})  # after the next batch
    assert json.loads(run.path.read_text()) == {"n": 8}
    assert len(list((tmp_path / "heal_bench").glob("*.json"))) == 1
    newer = bench_results.RawFile("heal_bench", {"tokens": 512}, what="quality", folder=tmp_path)
    newer.write({"n": 100})
    assert bench_results.latest(tmp_path / "heal_bench") == [newer.path]


def bench_scripts():
    """The scripts a person runs (the others are modules they share: the writer, reports)."""
    return sorted(p for p in (ROOT / "bench").glob("*.py")
                  if '__name__ == "__main__"' in p.read_text())


@pytest.mark.parametrize("script", bench_scripts(), ids=lambda p: p.name)
def test_every_bench_writes_through_the_raw_output_writer(script):
    """It imports bench_results' writer, and writes no result file of its own (no write_text,
    json.dump or open for writing outside the writer)."""
    tree = ast.parse(script.read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and n.module == "bench_results" for a in n.names}
    assert imported & {"save", "RawFile"}, f"{script.name} does not write through bench_results"
    own = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
           and isinstance(n.func, ast.Attribute) and n.func.attr in ("dump", "write_bytes")]
    writes = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Attribute) and n.func.attr == "write_text"]
    allowed = ALLOWED_WRITES.get(script.name, 0)
    assert not own and len(writes) <= allowed, (script.name, own, writes)


# Inputs a bench builds for itself (not results): data_bomb's crafted files, disagg's chat data,
# the int8 probe's prompt ids for its serving-venv stage.
ALLOWED_WRITES = {"data_bomb_bench.py": 1, "disagg_bench.py": 1, "vllm_int8_probe.py": 1}


def test_the_raw_folder_is_documented():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "bench/raw/" in text and "never overwrites" in text
