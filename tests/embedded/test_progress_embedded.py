"""Cancelled sweeps and drift runs on the embedded model keep their finished rows and lengths."""

import pytest

from pop_analysis.engine.models import model_from_hf
from pop_analysis.experiments.sweep import SweepConfig, length_sweep, ratio_sweep
from pop_analysis.inspection.drift import DriftConfig
from pop_analysis.inspection.drift_length import drift_by_length
from pop_analysis.progress import Cancelled
from pop_vllm.run_setting import RunSetting

from tiny import CancelWhen, tiny_model


@pytest.fixture(scope="module")
def tok_lm(embedded):
    tiny = tiny_model("llama", vocab_size=len(embedded.tokenizer), max_position_embeddings=1024)
    return model_from_hf(tiny.model, embedded.tokenizer, name="tiny-tok")


def test_cancelled_ratio_sweep_keeps_the_finished_rows(tok_lm):
    cfg = SweepConfig(dataset="builtin", n_samples=2, ratios=(0, 0.34, 0.5), max_new_tokens=2,
                      repeats=1, bench_tokens=16)
    stop = CancelWhen(lambda u: "timed pop" in u.message)  # after the first POP row
    with pytest.raises(Cancelled) as e:
        ratio_sweep(tok_lm, cfg, progress=stop)
    kept = e.value.partial
    assert [r["skip_ratio"] for r in kept.rows] == [0, 0.34], "rows finished before the cancel"
    assert kept.kind == "ratio" and kept.model == "tiny-tok"


def test_length_sweep_plan_weights_by_tokens_and_cancel_keeps_lengths(tok_lm):
    cfg = SweepConfig(lengths=(16, 32, 64), n_samples=1, repeats=1)
    seen = []

    def when(u):
        seen.append(u)
        return sum(x.message == "length: timed pop" for x in seen) == 2  # stop after 32 tokens

    with pytest.raises(Cancelled) as e:
        length_sweep(tok_lm, cfg, progress=CancelWhen(when))
    assert [r["length"] for r in e.value.partial.rows] == [16, 32]
    # the first timing (16 tokens) is the run's first step: one-time costs, no estimate from it
    first = next(i for i, u in enumerate(seen) if u.message == "length: timed pop")
    assert seen[first].eta_s is None
    assert any(u.eta_s is not None for u in seen[first + 1:]), "an estimate once timing was measured"


def test_cancelled_drift_by_length_keeps_finished_lengths(tok_lm):
    stop = CancelWhen(lambda u: u.message.startswith("32 tokens"))
    with pytest.raises(Cancelled) as e:
        drift_by_length(tok_lm, [16, 32, 48], RunSetting((4, 5)), DriftConfig(decode_steps=2),
                        progress=stop)
    assert [r["length"] for r in e.value.partial] == [16]
