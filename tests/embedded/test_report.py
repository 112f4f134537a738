"""The report command on the embedded model: tables, plots and verdicts written; what is cached rendered and the rest named; bad input one line."""
import json

import pytest

from pop_analysis import cli
from pop_analysis.engine.models import model_from_hf
from pop_analysis.experiments.report_doc import slug

from tiny import tiny_model

TINY_ARGS = ["--device", "cpu", "--n", "2", "--length-n", "2", "--mc-n", "2", "--lengths", "160",
             "--retrieval-length", "160", "--repeats", "1", "--json"]


@pytest.fixture(scope="module")
def model_dir(embedded, tmp_path_factory):
    tiny = tiny_model("llama", vocab_size=len(embedded.tokenizer), max_position_embeddings=1024)
    lm = model_from_hf(tiny.model, embedded.tokenizer, name="tiny-tok")
    d = tmp_path_factory.mktemp("tinymodel")
    lm.model.save_pretrained(d)
    lm.tokenizer.save_pretrained(d)
    return d


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_report_command_writes_tables_plots_and_verdicts(model_dir, cache, tmp_path, capsys,
                                                         shared_data):
    out = tmp_path / "docs" / "repro.md"
    assert cli.main(["report", "--model", str(model_dir), *TINY_ARGS, "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(summary["seconds"]) == {"table3", "table3_retrieval", "table4", "table4_retrieval",
                                       "length", "mc"}
    assert all(s is not None for s in summary["seconds"].values())
    text = out.read_text()
    for heading in ("## Table 3", "## Table 4", "## What matches the paper", "## Retrieval",
                    "## Multiple choice"):
        assert heading in text
    for variant in ("POP (last 1/3)", "shallow pruning", "w/o independent KV", "static removal"):
        assert variant in text
    assert "[" in text and "n = 2 per cell" in text and "Not computed yet" not in text
    figs = tmp_path / "docs" / "repro" / slug(str(model_dir))
    for png in ("table3.png", "table4.png"):
        assert (figs / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](repro/{figs.name}/{png})" in text
    # the cache holds every part: rendering again computes nothing and gives the same tables
    out.unlink()
    assert cli.main(["report", "--model", str(model_dir), *TINY_ARGS, "--render-only", "--out",
                     str(out)]) == 0
    capsys.readouterr()
    assert out.read_text() == text


def test_report_renders_what_is_cached_and_names_the_rest(model_dir, cache, tmp_path, capsys):
    out = tmp_path / "r.md"
    assert cli.main(["report", "--model", str(model_dir), *TINY_ARGS, "--parts", "table3",
                     "--out", str(out)]) == 0
    seconds = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["seconds"]
    assert seconds["table3"] is not None and seconds["table4"] is None
    text = out.read_text()
    assert "## Table 3" in text and "## Table 4" not in text and "Not computed yet: table3_retrieval" in text


@pytest.mark.parametrize("argv, message, code", [
    (["--parts", "table5"], "unknown report part", 1),
    (["--n", "0"], "--n: must be a whole number in 1..", 2), (["--out", "x.txt"], ".md", 1)])
def test_report_bad_input_is_one_line(model_dir, cache, capsys, argv, message, code):
    try:
        got = cli.main(["report", "--model", str(model_dir), "--device", "cpu", *argv])
    except SystemExit as e:  # refused while the flags are parsed
        got = e.code
    assert got == code
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_the_methods_part_renders_its_own_section_after_the_models_tables(model_dir, cache,
                                                                          tmp_path, capsys):
    out = tmp_path / "r.md"
    model = ["report", "--model", str(model_dir), *TINY_ARGS, "--out", str(out)]
    assert cli.main([*model, "--parts", "table3"]) == 0
    tables = out.read_text()
    assert cli.main([*model, "--parts", "methods", "--methods-n", "2", "--methods-eval-n", "2"]) == 0
    seconds = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["seconds"]
    assert seconds["methods"] is not None and seconds["table3"] is not None
    text = out.read_text()
    start, end = f"<!-- report {model_dir} methods -->", f"<!-- /report {model_dir} methods -->"
    assert text.index(f"<!-- /report {model_dir} -->") < text.index(start) < text.index(end)
    assert text.split(start)[0].strip() == tables.strip(), "the tables' section is kept as it was"
    section = text.split(start)[1]
    for heading in ("## Which method picks the best prefill skip set", "### The methods",
                    "### How the gate's ranking compares with drop-one", "### Verdicts (n = 2",
                    "### The tail baseline", "### ΔNLL of each method's set (block"):
        assert heading in section, heading
    figs = tmp_path / "r" / slug(str(model_dir))
    for png in ("methods_curves.png", "methods_agreement.png", "methods_triangle.png",
                "methods_frontier.png"):
        assert (figs / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    assert cli.main([*model, "--render-only", "--methods-n", "2", "--methods-eval-n", "2"]) == 0
    assert out.read_text() == text, "rendered again from the store, unchanged"
