"""Token-level quality metrics with POP semantics: the context goes through the variant's prefill,
everything after it through the full model (minus the decode-time drops of the static variant).

`score_continuations`, `greedy_tokens`, `agreement` and `choose` work on one prompt at a time;
`token_fidelity` compares a variant's teacher-forced distributions with the full model's
(batched evaluation: evaluate.py).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from pop_analysis.engine.generate import SamplingConfig, run
from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.pop import check_prompt, run_prompt, teacher_force
from pop_analysis.quality.items import EvalDataError
from pop_vllm.run_setting import RunSetting


@dataclass
class ContinuationScore:
    """Per-token log-probabilities of a known continuation under one variant."""

    token_ids: list[int]  # the continuation scored
    logprobs: list[float]  # log p(token_t | prompt, tokens_<t)
    argmax: list[int]  # the variant's greedy choice at each position (teacher-forced)

    @property
    def nll(self) -> float:
        """Mean per-token negative log-likelihood."""
        return -sum(self.logprobs) / len(self.logprobs)

    @property
    def total_logprob(self) -> float:
        return float(sum(self.logprobs))

    @property
    def is_greedy(self) -> bool:
        """True when greedy decoding would have produced exactly this continuation."""
        return self.argmax == self.token_ids


@torch.inference_mode()
def score_continuations(lm: LoadedModel, prompt_ids, continuations,
                        setting: RunSetting) -> list[ContinuationScore]:
    """Score several continuations of one prompt, sharing one (pruned) prefill.

    The prompt runs through `run_prompt` (the variant's prefill + boundary step); each
    continuation is then teacher-forced in one chunk through the full model (static: minus skip).
    """
    conts = [list(c) for c in continuations]
    if not conts or any(len(c) == 0 for c in conts):
        raise EvalDataError("every continuation to score needs at least one token")
    adapter = lm.adapter
    check_prompt(adapter, len(prompt_ids), max(len(c) for c in conts))
    ids = torch.tensor([list(prompt_ids)], device=adapter.device)  # (1, N)
    first = run_prompt(adapter, ids, setting)
    first_lp = torch.log_softmax(first.logits[0], -1)  # (V,)
    drop = setting.decode_drop
    out = []
    for j, cont in enumerate(conts):
        # teacher_force appends to the cache: later continuations need an untouched copy.
        cache = first.cache if j == len(conts) - 1 else copy.deepcopy(first.cache)
        lp = first_lp[None]  # (1, V)
        if len(cont) > 1:
            fed = torch.tensor([cont[:-1]], device=adapter.device)  # (1, M-1)
            logits = teacher_force(adapter, fed, cache, first.position, drop)  # (1, M-1, V)
            lp = torch.cat([lp, torch.log_softmax(logits[0], -1)])  # (M, V)
        target = torch.tensor(cont, device=lp.device)  # (M,)
        tok_lp = lp.gather(1, target[:, None])[:, 0]  # (M,)
        out.append(ContinuationScore(cont, tok_lp.tolist(), lp.argmax(-1).tolist()))
    return out


def continuation_nll(lm: LoadedModel, prompt_ids, continuation, setting: RunSetting) -> float:
    """Mean per-token NLL of `continuation` given `prompt_ids` under one setting."""
    return score_continuations(lm, prompt_ids, [continuation], setting)[0].nll


def greedy_tokens(lm: LoadedModel, prompt_ids, setting: RunSetting, max_new_tokens: int = 32,
                  stop_at_eos: bool = True) -> list[int]:
    """The setting's greedy continuation (POP generation: pruned prefill, full decode)."""
    cfg = SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0, stop_at_eos=stop_at_eos)
    return run(lm, list(prompt_ids), setting, cfg).token_ids


@dataclass(frozen=True)
class Agreement:
    """How a variant's greedy tokens compare with the full model's."""

    match_rate: float  # position-wise matches / the longer length (1.0 when identical)
    first_divergence: int | None  # first index that differs; None when identical
    exact: bool  # identical sequences


def agreement(reference, output) -> Agreement:
    ref, out = list(reference), list(output)
    if ref == out:
        return Agreement(1.0, None, True)
    matches = sum(a == b for a, b in zip(ref, out))
    first = next((i for i, (a, b) in enumerate(zip(ref, out)) if a != b), min(len(ref), len(out)))
    return Agreement(matches / max(len(ref), len(out)), first, False)


def choose(lm: LoadedModel, context_ids, choices, setting: RunSetting,
           length_normalise: bool = False) -> tuple[int, list[float]]:
    """Multiple choice by log-likelihood: (index of the best choice, score of each choice).

    Scores are summed log-probabilities (or per-token means when `length_normalise`).
    """
    scored = score_continuations(lm, context_ids, choices, setting)
    vals = [s.total_logprob / (len(s.token_ids) if length_normalise else 1) for s in scored]
    return max(range(len(vals)), key=vals.__getitem__), vals


@dataclass
class Fidelity:
    """Per-token comparison of one variant with the full model over known continuations."""

    nll: torch.Tensor  # (B, M) -log p_variant(target)
    top1: torch.Tensor  # (B, M) 1.0 where the variant's argmax is the target
    kl: torch.Tensor  # (B, M) KL(full || variant) of the next-token distributions, nats
    agree: torch.Tensor  # (B, M) 1.0 where the variant's argmax is the full model's argmax


def token_fidelity(lp: torch.Tensor, full_lp: torch.Tensor, targets: torch.Tensor) -> Fidelity:
    """Teacher-forced log-probs lp and full_lp (B, M, V) on targets (B, M) -> per-token metrics."""
    own = self_fidelity(lp, targets)
    kl = (full_lp.exp() * (full_lp - lp)).sum(-1).clamp_min(0.0)  # (B, M)
    agree = (lp.argmax(-1) == full_lp.argmax(-1)).float()  # (B, M)
    return Fidelity(own.nll, own.top1, kl, agree)


def self_fidelity(lp: torch.Tensor, targets: torch.Tensor) -> Fidelity:
    """`token_fidelity` of the full model against itself: KL 0 and agreement 1 by definition."""
    nll = -lp.gather(-1, targets[..., None])[..., 0]  # (B, M)
    top1 = (lp.argmax(-1) == targets).float()  # (B, M)
    return Fidelity(nll, top1, torch.zeros_like(nll), torch.ones_like(nll))
