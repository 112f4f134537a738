"""Batched evaluation of several variants over one item set, the full model's pass shared.

For each batch of items (prompts left-padded, grouped by length under a token budget):
1. the full model reads the prompts once: its greedy output (the reference for agreement, and the
   continuation of prompt-only items) and its teacher-forced next-token distributions over the
   continuation, kept while the batch lasts;
2. every other variant reads the same prompts with its own prefill, from its first skipped layer
   up (below it the full model's hidden states are exact for it: trunk.py); its teacher-forced
   distributions are compared with the full model's on EVERY continuation token (NLL, top-1,
   KL(full || variant), argmax agreement) and its greedy output with the full model's.
Per-item values come back in item order (`ItemScores`); quality.py turns them into estimates with
95% intervals, paired against the full model.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from pop_analysis.engine.generate import eos_ids
from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.pop import (
    FirstStep,
    check_prompt,
    greedy_from,
    left_pad,
    run_prompt,
    teacher_force,
)
from pop_analysis.engine.precision import check_available, decode_twins
from pop_analysis.engine.trunk import (
    borrow_lower,
    continue_from,
    full_chunk,
    prompt_from,
    start_layer,
)
from pop_analysis.quality.answers import answer_matches
from pop_analysis.quality.items import EvalDataError
from pop_analysis.quality.metrics import agreement, self_fidelity, token_fidelity
from pop_vllm.run_setting import RunSetting

TOKEN_BUDGET = 2048  # padded tokens (prompt + continuation) per batch: bounds memory and padding
MAX_BATCH = 16  # items per batch
# Log-probabilities held per batch, (B, M, V) floats: a batch keeps several such tensors (the
# full model's and a variant's), so a large vocabulary gets fewer tokens per batch (SmolLM2's
# 49k: the whole TOKEN_BUDGET; Gemma-3's 262k: 476 tokens, about 2 GB at the peak, not 10).
LOGIT_BUDGET = 125_000_000


def token_budget_for(vocab: int, token_budget: int = TOKEN_BUDGET) -> int:
    """Padded tokens per batch for a vocabulary of `vocab`: within both budgets, at least 1."""
    return max(1, min(token_budget, LOGIT_BUDGET // max(vocab, 1)))


@dataclass(frozen=True)
class Arm:
    """One arm of a comparison with the full model: a label and the run setting behind it."""

    name: str  # the label of its results ("pop", "shallow", "ratio 0.4" ...)
    setting: RunSetting = RunSetting.full()  # how it runs the prompt


FULL = Arm("full")


@dataclass
class ItemScores:
    """Per-item values of one variant, in item order (None: not measured for that item)."""

    arm: Arm
    continuation_nll: list = field(default_factory=list)  # mean per-token NLL of the continuation
    teacher_forced_top1: list = field(default_factory=list)  # continuation tokens that are its argmax
    next_token_kl: list = field(default_factory=list)  # mean KL(full || variant) per token, nats
    next_token_top1: list = field(default_factory=list)  # tokens where its argmax = the full model's
    greedy_agreement: list = field(default_factory=list)  # token match rate with full's greedy output
    sequence_exact: list = field(default_factory=list)  # 1.0 when its greedy output equals full's
    first_divergence: list = field(default_factory=list)  # first differing index (None: identical)
    answer_correct: list = field(default_factory=list)  # 1.0 / 0.0 against a gold answer, else None
    outputs: list = field(default_factory=list)  # decoded greedy output

    @classmethod
    def empty(cls, arm: Arm, n: int) -> "ItemScores":
        s = cls(arm)
        for name in PER_ITEM:
            setattr(s, name, [None] * n)
        return s


PER_ITEM = ("continuation_nll", "teacher_forced_top1", "next_token_kl", "next_token_top1",
            "greedy_agreement", "sequence_exact", "first_divergence", "answer_correct", "outputs")


def evaluate_variants(lm: LoadedModel, items, variants, max_new_tokens: int = 32,
                      generate: bool = True, token_budget: int = TOKEN_BUDGET,
                      step=None) -> dict[str, ItemScores]:
    """Every metric of each arm (`variants`: Arms) over `items`, batched; {name: ItemScores},
    "full" included.

    Items without reference_ids score the full model's greedy output (max_new_tokens, up to
    EOS) as their continuation. `generate=False` skips greedy decoding (agreement, answers)
    unless such items need it. `step(k)` is called after each variant finishes k items.
    """
    items, variants = list(items), _unique(variants)
    if not items:
        raise EvalDataError("nothing to evaluate: the item set is empty")
    if max_new_tokens < 1:
        raise EvalDataError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    for v in variants:
        v.setting.check(lm.adapter.n_layers)
        check_available(lm.adapter, v.setting)
    out = {v.name: ItemScores.empty(v, len(items)) for v in [FULL, *variants]}
    run = _BatchRun(lm, max_new_tokens, generate, step)
    budget = token_budget_for(lm.adapter.shape.vocab, token_budget)
    for idx in batches(items, max_new_tokens, budget):
        run.batch([items[i] for i in idx], idx, variants, out)
    return out


def _unique(variants) -> list[Arm]:
    """Variants other than the full model, each name once."""
    seen, out = set(), []
    for v in variants:
        if v.name in seen:
            raise EvalDataError(f"variant name {v.name!r} given twice")
        seen.add(v.name)
        if v.name != "full":
            out.append(v)
    return out


def batches(items, max_new_tokens: int, token_budget: int = TOKEN_BUDGET) -> list[list[int]]:
    """Item indices grouped by length: each batch's padded size stays within the budget."""
    size = [len(it.prompt_ids) + (len(it.reference_ids) or max_new_tokens) for it in items]
    order = sorted(range(len(items)), key=size.__getitem__)
    groups: list[list[int]] = []
    for i in order:
        g = groups[-1] if groups else None
        if g is not None and len(g) < MAX_BATCH and (len(g) + 1) * _padded(items, g + [i],
                                                                           max_new_tokens) <= token_budget:
            g.append(i)
        else:
            groups.append([i])
    return groups


def _padded(items, idx, max_new_tokens) -> int:
    return (max(len(items[i].prompt_ids) for i in idx)
            + max(len(items[i].reference_ids) or max_new_tokens for i in idx))


class _BatchRun:
    """One evaluation: the model, its settings, and what one batch of items does."""

    def __init__(self, lm: LoadedModel, max_new_tokens, generate, step):
        self.lm, self.adapter = lm, lm.adapter
        self.max_new, self.generate, self.step = max_new_tokens, generate, step
        self.stop = eos_ids(lm)
        self.twins = {}  # the decode int8 copies of the variant being run (uniform int8 only)
        self.pad = self.lm.tokenizer.pad_token_id if lm.tokenizer is not None else None

    def batch(self, items, idx, variants, out) -> None:
        a = self.adapter
        ids, mask = left_pad([list(it.prompt_ids) for it in items], self.pad or 0, a.device)  # (B, N)
        longest = max(max(len(it.reference_ids) for it in items), self.max_new)
        check_prompt(a, ids.shape[1], longest)
        starts = {v.name: start_layer(a, v.setting) for v in variants}
        shared = sorted({s for s in starts.values() if s > 0})
        cache = a.new_cache()
        h, trunk = full_chunk(a, ids, cache, 0, mask, shared)  # (B, N, D), {layer: (B, N, D)}
        first = FirstStep(a.logits(h[:, -1:])[:, -1, :].float(), cache, ids.shape[1], mask)  # (B, V)
        prompt_cache = copy.deepcopy(cache) if shared and self.generate else None
        generate = self.generate or any(not it.reference_ids for it in items)
        self.twins = {}  # the full model's reference decodes in fp32
        refs = self._greedy(first, ()) if generate else None
        conts = [list(it.reference_ids) or refs[k] for k, it in enumerate(items)]
        targets, valid = _right_pad(conts, a.device)  # (B, M) each
        full_lp, cont_trunk = self._full_logprobs(first, targets, mask, shared)  # (B, M, V)
        self._record(out["full"], items, idx, self_fidelity(full_lp, targets), valid, refs, refs)
        for v in variants:
            s, drop = starts[v.name], v.setting.decode_drop
            first = (prompt_from(a, trunk[s], s, v.setting, mask) if s else
                     run_prompt(a, ids, v.setting, attention_mask=mask))
            self.twins = decode_twins(a, v.setting.precision)  # {} unless uniform int8
            outs = self._greedy(first, drop, prompt_cache, s) if self.generate else None
            lp = self._logprobs(first, targets, mask, drop, cont_trunk.get(s), s)  # (B, M, V)
            self._record(out[v.name], items, idx, token_fidelity(lp, full_lp, targets), valid,
                         outs, refs)
        del full_lp

    def _greedy(self, first, drop, lower=None, start: int = 0) -> list[list[int]]:
        """Greedy outputs cut after their first stop token (as generation stops there); `lower`
        lends layers below `start` to a variant that ran only from there."""
        first = copy.copy(first)
        first.cache = copy.deepcopy(first.cache)  # teacher forcing reads the untouched cache
        if start:
            borrow_lower(self.adapter, first.cache, lower, start)
        rows = greedy_from(self.adapter, first, drop, self.max_new, self.stop,
                           self.twins).tolist()
        return [_cut(r, self.stop) for r in rows]

    def _full_logprobs(self, first, targets, mask, shared):
        """The full model's teacher-forced log-probs (B, M, V) and its hidden states entering
        each shared layer at the fed positions."""
        lp = torch.log_softmax(first.logits, -1)[:, None]  # (B, 1, V)
        if targets.shape[1] == 1:
            return lp, {}
        fed, am = self._fed(targets, mask)
        h, trunk = full_chunk(self.adapter, fed, first.cache, first.position, am, shared)  # (B, M-1, D)
        logits = self.adapter.logits(h).float()  # (B, M-1, V)
        return torch.cat([lp, torch.log_softmax(logits, -1)], dim=1), trunk  # (B, M, V)

    def _logprobs(self, first, targets, mask, drop, trunk=None, start: int = 0) -> torch.Tensor:
        """Teacher-forced log-probs (B, M, V) of every continuation position."""
        lp = torch.log_softmax(first.logits, -1)[:, None]  # (B, 1, V)
        if targets.shape[1] > 1:
            fed, am = self._fed(targets, mask)
            logits = (continue_from(self.adapter, trunk, start, first.cache, first.position, drop, am)
                      if start else
                      teacher_force(self.adapter, fed, first.cache, first.position, drop, am,
                                    self.twins))  # (B, M-1, V)
            lp = torch.cat([lp, torch.log_softmax(logits, -1)], dim=1)  # (B, M, V)
        return lp

    @staticmethod
    def _fed(targets, mask):
        """Tokens fed for teacher forcing (B, M-1) and the mask over prompt + them; right
        padding only feeds later (ignored) positions."""
        fed = targets[:, :-1]  # (B, M-1)
        return fed, torch.cat([mask, torch.ones_like(fed)], dim=1)  # (B, N+M-1)

    def _record(self, s: ItemScores, items, idx, fid, valid, outs, refs) -> None:
        n_tok = valid.sum(1)  # (B,)
        per_item = {k: ((getattr(fid, k) * valid).sum(1) / n_tok).tolist()
                    for k in ("nll", "top1", "kl", "agree")}
        tok = self.lm.tokenizer
        for k, (i, it) in enumerate(zip(idx, items)):
            s.continuation_nll[i] = per_item["nll"][k]
            s.teacher_forced_top1[i] = per_item["top1"][k]
            s.next_token_kl[i] = per_item["kl"][k]
            s.next_token_top1[i] = per_item["agree"][k]
            if outs is None:
                continue
            _greedy_fields(s, i, refs[k], outs[k])
            text = tok.decode(outs[k], skip_special_tokens=True) if tok is not None else ""
            if it.meta.get("stop_text"):  # e.g. where a few-shot model starts the next question
                text = text.split(it.meta["stop_text"])[0]
            s.outputs[i] = text
            if it.answer is not None:
                first = it.meta.get("answer_rule") == "first"
                s.answer_correct[i] = float(answer_matches(text, it.answer, first))
        if self.step:
            self.step(len(items))


def _greedy_fields(s: ItemScores, i: int, ref, out) -> None:
    ag = agreement(ref, out)
    s.greedy_agreement[i], s.sequence_exact[i] = ag.match_rate, float(ag.exact)
    s.first_divergence[i] = ag.first_divergence


def _cut(tokens: list[int], stop) -> list[int]:
    for j, t in enumerate(tokens):
        if t in stop:
            return tokens[:j + 1]
    return tokens


def _right_pad(conts, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Continuations -> targets (B, M) right-padded with their last token, and a validity mask."""
    m = max(len(c) for c in conts)
    targets = torch.tensor([c + [c[-1]] * (m - len(c)) for c in conts], device=device)  # (B, M)
    valid = torch.tensor([[1.0] * len(c) + [0.0] * (m - len(c)) for c in conts])  # (B, M)
    return targets, valid.to(device)
