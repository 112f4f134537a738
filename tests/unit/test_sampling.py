"""generate.nucleus: the topk shortcut keeps exactly what a full sort of the vocabulary keeps."""
import pytest
import torch
from scipy.stats import chisquare

from pop_analysis.engine.generate import (
    NUCLEUS_CANDIDATES,
    SamplingConfig,
    draw,
    nucleus,
    pick,
)


def full_sort_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The plain algorithm: sort everything, keep the smallest prefix reaching top_p."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p > top_p
    return torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))


@pytest.mark.parametrize("scale", [0.3, 1.0, 4.0, 12.0])  # flat (full sort) ... peaked (topk)
@pytest.mark.parametrize("top_p", [0.1, 0.9, 0.95, 1.0 - 1e-6])
def test_nucleus_equals_full_sort(scale, top_p):
    gen = torch.Generator().manual_seed(int(scale * 100) + int(top_p * 1000))
    logits = torch.randn(6, 5000, generator=gen) * scale  # (B, V)
    probs = torch.softmax(logits, dim=-1)
    assert torch.equal(nucleus(probs, top_p), full_sort_nucleus(probs, top_p))


def test_both_branches_are_taken():
    """A peaked row ends its nucleus among the candidates, a flat one does not: both paths run."""
    peaked = torch.softmax(torch.randn(1, 4000) * 10, dim=-1)
    flat = torch.full((1, 4000), 1 / 4000)
    k_cut = lambda p: int((p.sort(descending=True)[0].cumsum(-1) <= 0.9).sum())  # noqa: E731
    assert k_cut(peaked) < NUCLEUS_CANDIDATES < k_cut(flat)
    for probs in (peaked, flat, torch.cat([peaked, flat])):
        assert torch.equal(nucleus(probs, 0.9), full_sort_nucleus(probs, 0.9))


def test_small_vocabulary_below_the_candidate_count():
    probs = torch.softmax(torch.randn(3, 50), dim=-1)
    assert torch.equal(nucleus(probs, 0.8), full_sort_nucleus(probs, 0.8))


def test_pick_draws_from_the_full_sort_nucleus():
    cfg = SamplingConfig(temperature=0.7, top_p=0.9)
    logits = torch.randn(4, 3000, generator=torch.Generator().manual_seed(3)) * 5
    for seed in range(20):
        got = pick(logits, cfg, torch.Generator().manual_seed(seed))
        probs = full_sort_nucleus(torch.softmax(logits / cfg.temperature, dim=-1), cfg.top_p)
        assert torch.equal(got, draw(probs, torch.Generator().manual_seed(seed)))
        assert bool((probs.gather(1, got) > 0).all())  # never outside the nucleus


def test_draw_follows_the_distribution_and_never_picks_zero():
    probs = torch.tensor([[0.0, 0.5, 0.25, 0.0, 0.125, 0.125, 0.0]])  # zeros at both ends
    gen = torch.Generator().manual_seed(7)
    counts = torch.zeros(7)
    for _ in range(4000):
        counts[draw(probs, gen)[0, 0]] += 1
    assert counts[[0, 3, 6]].sum() == 0
    kept = probs[0] > 0
    test = chisquare(counts[kept].numpy(), (4000 * probs[0, kept]).numpy())
    assert test.pvalue > 0.01, (counts, test)


def test_draw_when_the_uniform_reaches_the_total(monkeypatch):
    """A uniform that rounds up to the total goes to the last token that has probability."""
    probs = torch.tensor([[0.3, 0.7, 0.0, 0.0], [0.2, 0.2, 0.2, 0.4]])
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.ones(*shape, dtype=kw["dtype"]))
    assert draw(probs, None).tolist() == [[1], [3]]
