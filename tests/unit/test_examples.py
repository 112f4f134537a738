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
from pop_analysis.inspection.heal_drift import HealDrift
from pop_analysis.inspection.side_by_side import GenerationResult
from pop_analysis.inspection.stepthrough import StepThrough
from pop_analysis.store import examples as ex
from pop_analysis.store.records import check

CLASSES = {"calibration": CalibrationResult, "drift": DriftResult, "sweep": SweepResult,
           "generation": GenerationResult, "stepthrough": StepThrough, "heal_drift": HealDrift,
           "heal_stepthrough": StepThrough}
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
        got = ex.load_example(model, kind, partial(check, ex.store_kind(kind), CLASSES[kind],
                                                   n_layers=LAYERS[model]), notes.append)
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


# ---------------------------------------------------------------- what the timings teach

@pytest.mark.parametrize("model", sorted(REGISTRY))
def test_the_shipped_timings_teach_the_lesson(model):
    """No shipped ratio is flagged or above its ideal by more than the protocol's margin, and the
    step-through's clock shows POP's first token before the full model's."""
    from pop_analysis.speed.example_timings import problems

    for kind in ("stepthrough", "heal_stepthrough", "generation", "sweep"):
        got = ex.load_example(model, kind)
        assert got is not None
        assert problems(kind, got.payload) == [], (model, kind, got.label["command"])
    for kind in ("stepthrough", "heal_stepthrough"):
        t = ex.load_example(model, kind).payload["ttft"]
        assert t["pop_ms"] < t["full_ms"] and "clock" in t


@pytest.mark.parametrize("model", sorted(REGISTRY))
def test_the_healing_step_through_heals_on_the_plain_ones_prompt_and_skip_set(model):
    """The healed example is the shipped step-through's run with healing: the same prompt and skip
    set, heal passes between the POP run's decode steps, and the full run untouched."""
    plain, healed = (ex.load_example(model, k).payload for k in ("stepthrough", "heal_stepthrough"))
    assert (healed["prompt"], healed["skip_layers"]) == (plain["prompt"], plain["skip_layers"])
    pop = [s["stage"] for s in healed["steps"] if s["run"] == "pop"]
    assert pop == ["prefill", "boundary", "heal 1", "decode 1", "heal 2", "decode 2", "heal 3",
                   "decode 3"], "16 positions per step heal the 37-token prompt in three passes"
    assert [s["stage"] for s in healed["steps"] if s["run"] == "full"] == \
        [s["stage"] for s in plain["steps"] if s["run"] == "full"]
    # the passes re-run every layer from the first skipped one up, nothing below it, over the
    # positions in order: the prompt, then the two decode tokens that joined the queue meanwhile
    n, first = len(healed["prompt_ids"]), min(healed["skip_layers"])
    heals = [s for s in healed["steps"] if s["stage"].startswith("heal")]
    for i in range(healed["n_layers"]):
        rows = [p for s in heals for p in s["attention"][i]]
        assert rows == (list(range(n + 2)) if i >= first else []), (model, i)
        assert all(s["kv"][i] == [] and s["token"] is None for s in heals)


def test_a_healing_example_that_does_not_heal_is_refused_in_one_line(tmp_path):
    root = tmp_path / "examples"
    shutil.copytree(ex.EXAMPLES_DIR, root)
    path = ex.example_path("smollm2-135m", "heal_stepthrough", root)
    entry = json.loads(path.read_text())
    entry["payload"]["config"]["heal"] = {"policy": "none"}
    path.write_text(json.dumps(entry))
    ex.write_checksums(root)
    notes = []
    assert ex.load_example("smollm2-135m", "heal_stepthrough", notice=notes.append, root=root) is None
    assert notes == ["stored example smollm2-135m/heal_stepthrough not used (its POP run does not "
                     "heal (config.heal))"]


def _shipped(kind: str) -> dict:
    return json.loads(ex.example_path("gemma3-270m", kind).read_text())["payload"]


def test_each_timing_the_examples_must_not_ship_is_named_in_one_line():
    from pop_analysis.speed.example_timings import problems

    step = _shipped("stepthrough")
    step["ttft"].update(trustworthy=False, note="machine busy (x)", full_ms=100.0, pop_ms=120.0,
                        speedup=0.9)
    got = problems("stepthrough", step)
    assert any("flagged (machine busy (x))" in line for line in got)
    assert any("POP's first token (120 ms) is not before the full model's (100 ms)" in line
               for line in got)
    gen = _shipped("generation")
    gen["speed"]["timing"].update(trustworthy=True, note=None, speedup=2.0)
    gen["speed"]["ideal_speedup"] = 1.43
    assert problems("generation", gen)[0] == (
        f"generation TTFT at {gen['speed']['tokens']} tokens: 2.00x is more than 10% above its "
        "ideal 1.43x")
    sweep = _shipped("sweep")
    timed = [r for r in sweep["rows"] if r["timing_rounds"]]
    for r in timed:
        r.update(timing_trustworthy=True, timing_note=None, prefill_speedup=r["ideal_speedup"])
    assert problems("sweep", sweep) == []
    timed[0].update(timing_trustworthy=False, timing_note="rounds disagree (y)")
    assert problems("sweep", sweep) == [
        f"sweep pop skip {timed[0]['skip_ratio']:g} at 512 tokens: "
        f"{timed[0]['prefill_speedup']:.2f}x flagged (rounds disagree (y))"]
    assert problems("calibration", {}) == []


def test_the_examples_command_refuses_a_flagged_timing_and_keeps_the_shipped_file(
        tmp_path, monkeypatch, capsys):
    """A part whose timing stays flagged is timed again --tries times, then refused in one line
    (exit 1); the file in --out is left as it was."""
    from pop_analysis.cli import main
    from pop_analysis.commands import examples as cmd
    from pop_analysis.store import results as store

    out = tmp_path / "examples"
    shutil.copytree(ex.EXAMPLES_DIR, out)
    before = ex.example_path("gemma3-270m", "generation", out).read_bytes()
    entry = json.loads(before)
    entry.pop("example")
    entry["payload"]["speed"]["timing"].update(trustworthy=False, note="machine busy (z)")
    calls = []

    def flagged(lm):  # what a busy machine makes: the part's store entry, flagged
        calls.append(1)
        store.save("generation", entry["key"], entry["payload"], entry["params"])

    class Model:
        name, dtype = "gemma3-270m", "float32"

    monkeypatch.setattr(cmd, "load", lambda args: Model())
    monkeypatch.setitem(cmd.MAKERS, "generation", (lambda lm: "the sky", flagged))
    code = main(["examples", "--model", "gemma3-270m", "--parts", "generation", "--tries", "2",
                 "--quiet-wait", "0", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(calls) == 2
    assert err[-1].startswith("gemma3-270m/generation not stored: generation TTFT at ")
    assert "flagged (machine busy (z))" in err[-1] and err[-1].endswith("(rerun on a quiet machine)")
    assert ex.example_path("gemma3-270m", "generation", out).read_bytes() == before


def test_an_example_made_with_another_model_is_refused_in_one_line(tmp_path):
    """A file in the loaded model's folder is used only when it names that model, in its label
    and in its payload: Gemma's step-through copied into SmolLM2's folder is not shown."""
    root = tmp_path / "examples"
    shutil.copytree(ex.EXAMPLES_DIR, root)
    shutil.copy(ex.example_path("gemma3-270m", "stepthrough", root),
                ex.example_path("smollm2-135m", "stepthrough", root))
    ex.write_checksums(root)
    notes = []
    assert ex.load_example("smollm2-135m", "stepthrough", notice=notes.append, root=root) is None
    assert notes == ["stored example smollm2-135m/stepthrough not used (it was made with "
                     "gemma3-270m, not smollm2-135m)"]
    path = ex.example_path("smollm2-135m", "generation", root)
    entry = json.loads(path.read_text())
    entry["payload"]["model"] = "gemma3-270m"  # the label still says smollm2-135m
    path.write_text(json.dumps(entry))
    ex.write_checksums(root)
    notes.clear()
    assert ex.load_example("smollm2-135m", "generation", notice=notes.append, root=root) is None
    assert "it was made with gemma3-270m, not smollm2-135m" in notes[0]


@pytest.mark.parametrize("model", sorted(REGISTRY))
def test_the_shipped_step_through_grids_are_pops_structure(model):
    """The shipped grids hold the cells the method prescribes (tests/step_checks.py), for the
    skip set each was recorded with."""
    from step_checks import assert_pop_structure

    rec = StepThrough.from_dict(ex.load_example(model, "stepthrough").payload)
    assert rec.skip_layers and rec.n_layers == LAYERS[model]
    assert_pop_structure(rec, tuple(rec.skip_layers))
