"""The certified choice on a tiny model with planted identity layers: the search's sequence is
nested and built on the selection items, the certificate holds the planted layers (and the last
layer, exact under POP), every set before it passed, and the stored record is checked; a
sequence whose first set fails certifies nothing and names its bound in one line."""
import pytest

from pop_analysis.experiments.certify import (CertifyConfig, CertifyError, CertifyResult,
    candidates, certify)
from pop_analysis.experiments.methods_run import ImportanceConfig, run_importance
from pop_analysis.experiments.methods_store import check_certificate
from pop_analysis.quality.items import EvalItem
from pop_analysis.quality.splits import Split, item_fingerprint
from pop_analysis.store.records import RecordError

from tiny import planted_model, tiny_model, tiny_prompt

PLANTED = (1, 3)
PROMPTS = [tiny_prompt(n, seed=n) for n in (5, 9, 3, 12, 7, 6)]
SEL = [EvalItem(tuple(tiny_prompt(4 + i % 7, seed=200 + i))) for i in range(10)]
CERT = [EvalItem(tuple(tiny_prompt(3 + i % 9, seed=400 + i))) for i in range(40)]
FAST = dict(alpha=0.2, epsilon=1e-3, delta=0.1, answer_tokens=4, chunk=2)


def _splits():
    fp = lambda items: tuple(item_fingerprint(it.prompt_ids) for it in items)  # noqa: E731
    return [Split("ranking", "tiny prompts", 0, 6, "", fp([EvalItem(tuple(p)) for p in PROMPTS])),
            Split("selection", "tiny", 0, len(SEL), "", fp(SEL)),
            Split("certification", "tiny", 100, len(CERT), "", fp(CERT))]


@pytest.fixture(scope="module")
def lm():
    return planted_model(PLANTED)


@pytest.fixture(scope="module")
def ranked(lm):
    return run_importance(lm, PROMPTS, ImportanceConfig(methods=("gate",), n_samples=6,
                                                       new_tokens=4, resamples=0))


def test_the_certified_set_holds_the_planted_identity_layers(lm, ranked):
    res = certify(lm, ranked.series["gate.prefill"], _splits(), CertifyConfig(**FAST, refine=3),
                  items=(SEL, CERT))
    assert res.met and res.certified == sorted(PLANTED + (5,)), res.sequence
    seq = [set(c["skip_layers"]) for c in res.sequence]
    assert all(a < b for a, b in zip(seq, seq[1:])), "the sequence is nested"
    assert res.sequence[-1]["selection_rate"] > 0.2 >= res.sequence[-2]["selection_rate"]
    tested = [c for c in res.sequence if c.get("tested")]
    assert [c["passed"] for c in tested] == [True] * 3 + [False] * (len(tested) - 3)
    assert res.bound <= 0.2 and res.rate == 0 and tested[0]["n"] == 40
    assert res.statement == ("certified: at most 20% of items lose more than 0.001 nats per "
                             "token, with 90% confidence, on 40 items it never chose on")
    assert "not other tasks" in res.not_covered and "\n" not in res.note
    assert res.estimate["kind"].startswith("estimate") and res.estimate["n"] == 40
    assert [s["role"] for s in res.splits] == ["ranking", "selection", "certification"]
    check_certificate(res.to_dict(), CertifyResult, 6)
    broken = res.to_dict() | {"certified": [1, 2]}
    with pytest.raises(RecordError, match="did not pass"):
        check_certificate(broken, CertifyResult, 6)


def test_the_divergence_loss_certifies_the_planted_layers_too(lm, ranked):
    """Bad = POP's greedy output departs from the full model's within 3 tokens."""
    res = certify(lm, ranked.series["gate.prefill"], _splits(),
                  CertifyConfig(**FAST | dict(loss="divergence", tokens=3, refine=1)),
                  items=(SEL, CERT))
    assert res.met and set(res.certified) <= set(PLANTED + (5,)) and res.rate == 0
    assert "depart from the full model's within 3 tokens" in res.statement


def test_a_sequence_whose_first_set_fails_certifies_nothing():
    lm = tiny_model("llama", seed=5)
    res = certify(lm, [0.0, 1, 2, 3, 4, 5], _splits(), CertifyConfig(**FAST, refine=1),
                  items=(SEL, CERT))
    assert not res.met and res.certified == [] and res.sequence[0]["skip_layers"] == [0]
    assert sum(1 for c in res.sequence if c.get("tested")) == 1, "nothing after the failure"
    assert res.note.startswith("no set certified at α = 0.2, δ = 0.1: the smallest set "
                               "(layers 0)") and "upper bound" in res.note
    check_certificate(res.to_dict(), CertifyResult, 6)


def test_block_candidates_grow_at_either_end_and_bad_settings_are_one_line():
    scores = [5.0, 4, 3, 0.5, 0.1, 2]
    assert candidates(scores, (), "block", 2) == [(4,), (3,)]
    assert candidates(scores, (3, 4), "block", 3) == [(3, 4, 5), (2, 3, 4)]
    assert candidates(scores, (4,), "free", 2) == [(3, 4), (4, 5)]
    for kw, match in ((dict(alpha=1.0), "alpha must lie"), (dict(delta=0), "delta must lie"),
                      (dict(epsilon=-1), "epsilon"), (dict(loss="x"), "unknown loss"),
                      (dict(method="x"), "unknown method"), (dict(chunk=0), ">= 1")):
        with pytest.raises(CertifyError, match=match) as e:
            CertifyConfig(**kw)
        assert "\n" not in str(e.value)
