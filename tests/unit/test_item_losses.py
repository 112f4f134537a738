"""Per-item loss tables: computed a chunk at a time, resumed after a stop without recomputing what
was stored, equal to one batched evaluation of the same items, and refused for other items."""
import pytest

from pop_analysis.experiments.item_losses import (LossTableError, complete, compute_table,
    load_table)
from pop_analysis.quality.evaluate import Arm, evaluate_variants
from pop_analysis.quality.items import EvalItem
from pop_vllm.run_setting import RunSetting

from tiny import tiny_model, tiny_prompt

ITEMS = [EvalItem(tuple(tiny_prompt(3 + i, seed=i)), tuple(tiny_prompt(4, seed=50 + i)))
         for i in range(6)]
SETS = [(5,), (4, 5)]


class Stop(Exception):
    pass


def test_a_stopped_table_resumes_and_matches_one_evaluation(tmp_path):
    lm, path = tiny_model("llama", seed=2), tmp_path / "pool.json"
    lines = []

    def stop_after_one(line):
        lines.append(line)
        raise Stop

    with pytest.raises(Stop):
        compute_table(lm, ITEMS, SETS, path, "tiny", 4, chunk=2, log=stop_after_one)
    part = load_table(path)
    assert not complete(part) and part.full[:2] != (None, None) and part.full[2:] == (None,) * 4
    lines.clear()
    table = compute_table(lm, ITEMS, SETS, path, "tiny", 4, chunk=2, log=lines.append)
    assert complete(table) and len(lines) == 2, "the stored chunk is not recomputed"
    ref = evaluate_variants(lm, ITEMS, [Arm("5", RunSetting((5,)))], 4, generate=False)
    assert table.full == pytest.approx(ref["full"].continuation_nll, abs=1e-5)
    assert table.delta((5,)) == pytest.approx(
        [v - f for v, f in zip(ref["5"].continuation_nll, ref["full"].continuation_nll)], abs=1e-5)
    assert load_table(path) == table
    with pytest.raises(LossTableError, match="other items or another model"):
        compute_table(lm, ITEMS[::-1], SETS, path, "tiny", 4)
