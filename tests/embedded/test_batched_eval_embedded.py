"""Batched evaluation on the embedded model equals the item-by-item path."""
import math

from pop_analysis.quality.evalsets import load_eval_set
from pop_analysis.quality.evaluate import (
    FULL,
    Arm,
    evaluate_variants,
)
from pop_analysis.quality.metrics import greedy_tokens, score_continuations
from pop_vllm.run_setting import RunSetting


def close(a, b, tol=1e-4) -> bool:
    if a is None or b is None or isinstance(a, str):
        return a == b
    return math.isclose(a, b, abs_tol=tol)


def test_embedded_model_batched_equals_item_by_item(embedded, shared_data):
    items = load_eval_set(embedded, "gsm8k", limit=3).items + load_eval_set(
        embedded, "wizardlm", limit=2).items
    pop = Arm("pop", RunSetting(range(20, 30)))
    out = evaluate_variants(embedded, items, [FULL, pop], 8)
    for i, it in enumerate(items):
        ref = greedy_tokens(embedded, it.prompt_ids, RunSetting.full(), 8)
        cont = list(it.reference_ids) or ref
        s = score_continuations(embedded, it.prompt_ids, [cont], pop.setting)[0]
        assert close(out["pop"].continuation_nll[i], s.nll, 1e-3), (i, out["pop"].continuation_nll[i], s.nll)
        pop_out = greedy_tokens(embedded, it.prompt_ids, pop.setting, 8)
        assert out["pop"].outputs[i] == embedded.tokenizer.decode(pop_out, skip_special_tokens=True)
        assert out["full"].outputs[i] == embedded.tokenizer.decode(ref, skip_special_tokens=True)
    assert all(kl > 0 for kl in out["pop"].next_token_kl)
