"""The methods sections of docs/reproduction.md agree with the raw results under
docs/reproduction/raw/: the verdict lines, the tail baseline's counts and both ΔNLL tables are
regenerated from each model's methods.json (ties named as ties, budgets of one k merged) and
must appear in the docs as written; a changed number in the raw file makes this fail."""
import copy
from pathlib import Path

import pytest

from pop_analysis.experiments.methods_raw import load_raw, verdicts_of
from pop_analysis.experiments.report_methods import counted

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("smollm2-135m", "gemma3-270m")


def _section(model: str) -> str:
    md = (ROOT / "docs" / "reproduction.md").read_text(encoding="utf-8")
    start, end = f"<!-- report {model} methods -->", f"<!-- /report {model} methods -->"
    assert start in md and end in md, f"no methods section for {model}"
    return md.split(start, 1)[1].split(end, 1)[0]


def _regenerated(raw: dict) -> str:
    lines = counted(raw["rows"], verdicts_of(raw), raw["n"], ("block", "free"))
    return "\n".join(f"#{x}" if x.startswith("#") else x for x in lines)


@pytest.mark.parametrize("model", MODELS)
def test_the_docs_methods_tables_are_regenerated_from_the_raw_results(model):
    raw = load_raw(ROOT / "docs" / "reproduction" / "raw" / model / "methods.json")
    doc, want = _section(model), _regenerated(raw)
    missing = [line for line in want.splitlines() if line.strip() and line not in doc]
    assert not missing, f"{len(missing)} regenerated line(s) not in the docs, e.g. {missing[0]!r}"
    assert want.split("\n### The tail", 1)[0].strip() in doc, "the verdicts block is not in the docs whole"


def test_a_changed_raw_number_fails_the_check():
    raw = load_raw(ROOT / "docs" / "reproduction" / "raw" / MODELS[0] / "methods.json")
    bad = copy.deepcopy(raw)
    tail = next(r for r in bad["rows"] if r["method"] == "tail" and r["shape"] == "free")
    tail["continuation_nll_delta"] += 0.5
    doc = _section(MODELS[0])
    assert any(line not in doc for line in _regenerated(bad).splitlines() if line.strip())


def test_the_sets_recomputed_per_item_reproduce_the_published_rows():
    """Where per-item NLL was recomputed (a pool's tail sets on the same 100 items), the paired
    ΔNLL and its BCa interval equal the published row to the printed digits."""
    from pop_analysis.quality.stats import paired_delta

    raws = [load_raw(ROOT / "docs" / "reproduction" / "raw" / m / "methods.json") for m in MODELS]
    checked = [(raw, label) for raw in raws for label in raw.get("item_nll", {}) if label != "full"]
    assert len(checked) >= 4, "no recomputed sets to check"
    for raw, label in checked:
        nll = raw["item_nll"]
        d = paired_delta(nll[label], nll["full"])
        for row in (r for r in raw["rows"] if r["set"] == label):
            assert round(d.value, 3) == pytest.approx(row["continuation_nll_delta"], abs=1.1e-3)
            assert [round(x, 3) for x in d.ci] == pytest.approx(row["continuation_nll_delta_ci"],
                                                                 abs=1.1e-3)


@pytest.mark.parametrize("name", ["certify_simulation", "certify_simulation_eps02"])
def test_the_certification_simulation_in_the_docs_is_regenerated_from_the_pools(name):
    """The simulation's table and certificates in docs/importance.md come out again, digit for
    digit, from the stored per-item pools (the same splits: seeded) and the stored settings."""
    import json

    from pop_analysis.experiments.certify_report import markdown, run

    stored = json.loads((ROOT / "docs" / "reproduction" / "raw" / f"{name}.json").read_text())
    sizes = {m: (r["n_sel"], r["n_cert"]) for m, r in stored["models"].items()}
    out = run(stored["alpha"], stored["epsilon"], stored["delta"], stored["splits"],
              ROOT / "docs" / "reproduction" / "raw")
    assert {m: (r["n_sel"], r["n_cert"]) for m, r in out["models"].items()} == sizes, \
        "the pools grew since the docs were written: rerun scripts/certify_sim.py"
    doc = (ROOT / "docs" / "importance.md").read_text(encoding="utf-8")
    missing = [line for line in markdown(out, "") if line.startswith(("|", "-")) and line not in doc]
    assert not missing, f"not in docs/importance.md: {missing[0]!r}"
