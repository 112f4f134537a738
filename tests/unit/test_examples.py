"""The stored examples shipped for class mode: every file is pinned by SHA256SUMS, passes the
record checks of its kind like any stored result, names what it is, and stays small; a changed
or unlisted file is refused with one line."""
import json
import shutil
from functools import partial

import pytest

from pop_analysis.engine.embedded import REGISTRY
from pop_analysis.experiments.sweep import SweepResult
from pop_analysis.importance.calibrate import CalibrationResult
from pop_analysis.inspection.drift import DriftResult
from pop_analysis.inspection.side_by_side import GenerationResult
from pop_analysis.inspection.stepthrough import StepThrough
from pop_analysis.store import examples as ex
from pop_analysis.store.records import check

CLASSES = {"calibration": CalibrationResult, "drift": DriftResult, "sweep": SweepResult,
           "generation": GenerationResult, "stepthrough": StepThrough}
LAYERS = {"smollm2-135m": 30, "gemma3-270m": 18}  # the embedded models' depths


def test_the_checksum_file_pins_every_shipped_file():
    sums = ex.checksums()
    files = sorted(p.relative_to(ex.EXAMPLES_DIR).as_posix() for p in ex.EXAMPLES_DIR.glob("*/*.json"))
    assert sorted(sums) == files, "every example file is listed, and nothing else"
    for name, digest in sums.items():
        assert ex.digest(ex.EXAMPLES_DIR / name) == digest, f"{name} changed since SHA256SUMS"


@pytest.mark.parametrize("model", sorted(REGISTRY))
def test_every_kind_ships_for_each_embedded_model_and_passes_the_record_checks(model):
    assert set(LAYERS) == set(REGISTRY)
    for kind in ex.KINDS:
        notes = []
        got = ex.load_example(model, kind, partial(check, kind, CLASSES[kind], n_layers=LAYERS[model]),
                              notes.append)
        assert got is not None, f"{model}/{kind}: {notes}"
        assert got.label["model"] == model and got.payload.get("model") == model
        assert "python -m pop_analysis examples --model " + model in got.label["command"]
        CLASSES[kind].from_dict(got.payload)  # the page's object


def test_the_examples_stay_small():
    total = sum(p.stat().st_size for p in ex.EXAMPLES_DIR.glob("*/*.json"))
    assert total < 4 * 2 ** 20, f"{total / 2 ** 20:.1f} MiB of examples"


def test_a_changed_or_unlisted_file_is_refused_in_one_line(tmp_path):
    root = tmp_path / "examples"
    shutil.copytree(ex.EXAMPLES_DIR, root)
    path = ex.example_path("smollm2-135m", "stepthrough", root)
    entry = json.loads(path.read_text())
    entry["payload"]["prompt"] = "edited by hand"
    path.write_text(json.dumps(entry))
    notes = []
    assert ex.load_example("smollm2-135m", "stepthrough", notice=notes.append, root=root) is None
    assert notes == [("stored example smollm2-135m/stepthrough not used (its checksum is not the "
                      "one in SHA256SUMS)")]
    ex.write_checksums(root)  # listed again: now the record check decides
    entry["payload"]["steps"][0]["kv"] = [[0]]  # one layer's row where 30 belong
    path.write_text(json.dumps(entry))
    ex.write_checksums(root)
    notes.clear()
    got = ex.load_example("smollm2-135m", "stepthrough",
                          lambda p: check("stepthrough", StepThrough, p, 30), notes.append, root)
    assert got is None and "steps[0].kv" in notes[0]
    (root / ex.SUMS).write_text("")
    assert ex.load_example("smollm2-135m", "generation", notice=notes.append, root=root) is None
