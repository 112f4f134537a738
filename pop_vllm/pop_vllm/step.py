"""What the model needs to know about the current engine step, captured from the model runner.

vLLM's attention metadata has no prompt lengths, so the runner's `_model_forward` is wrapped to
record, per step, each request's prompt length, computed and scheduled tokens (batch order); and
`AttentionGroup.build_metadata` is wrapped to keep the CommonAttentionMetadata it was given, so a
skipped layer can have the *same builder* build metadata for the full tokens only (a configuration
of any backend's builder, not a rewrite of one backend's fields).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from .plan import StepPlan, plan_step
from .prefix import full_path


@dataclass
class StepFacts:
    prompt_len: np.ndarray  # (R,)
    computed: np.ndarray  # (R,) tokens already in the KV cache before this step
    scheduled: np.ndarray  # (R,) tokens of this step
    groups: list  # [(AttentionGroup, CommonAttentionMetadata)] built for this step
    num_tokens: np.ndarray | None = None  # (R,) prompt + generated tokens known so far
    full_path: np.ndarray | None = None  # (R,) bool: the request asked for prompt log-probs

    def recomputed(self) -> int:
        """Generated tokens recomputed in this step: positions from the prompt length up to the
        newest token (excluded) that are scheduled again, which happens only when a preempted
        request resumes (a decode step schedules just the newest token)."""
        if self.num_tokens is None:
            return 0
        lo = np.maximum(self.computed, self.prompt_len)  # (R,)
        hi = np.minimum(self.computed + self.scheduled, self.num_tokens - 1)  # (R,)
        return int(np.clip(hi - lo, 0, None).sum())


_current: StepFacts | None = None
_groups: dict = {}  # id(AttentionGroup) -> (group, common metadata) of the latest build


def current() -> StepFacts | None:
    return _current


def wrap_build_metadata(build):
    """AttentionGroup.build_metadata keeping the step's common metadata (patches.py)."""
    def build_metadata(self, common_attn_metadata, ubatch_idx: int = 0, *args, **kwargs):
        if ubatch_idx == 0:
            _groups[id(self)] = (self, common_attn_metadata)
        return build(self, common_attn_metadata, ubatch_idx, *args, **kwargs)

    return build_metadata


def wrap_model_forward(forward):
    """GPUModelRunner._model_forward recording the step's facts (patches.py)."""
    def model_forward(self, *args, **kwargs):
        global _current
        batch = self.input_batch
        n = batch.num_reqs
        qsl = self.query_start_loc.np[: n + 1]
        _current = StepFacts(prompt_len=batch.num_prompt_tokens[:n].copy(),
                             computed=batch.num_computed_tokens_cpu[:n].copy(),
                             scheduled=np.diff(qsl).astype(np.int64),
                             groups=list(_groups.values()),
                             num_tokens=batch.num_tokens_no_spec[:n].copy(),
                             full_path=_wants_prompt_logprobs(self.requests, batch.req_ids[:n]))
        try:
            return forward(self, *args, **kwargs)
        finally:
            _current = None
            _groups.clear()

    return model_forward


def _wants_prompt_logprobs(requests: dict, req_ids) -> np.ndarray:
    """(R,) bool: which requests asked for prompt log-probs (`prompt_logprobs`, or `echo` with
    `logprobs` in the OpenAI API). Read from the request's own sampling parameters, which live as
    long as the request: a request resumed after a preemption stays on the full path."""
    return np.fromiter((full_path(requests.get(r)) for r in req_ids), dtype=bool,
                       count=len(req_ids))


def plan(facts: StepFacts, variant: str, n_tokens: int) -> StepPlan:
    return plan_step(facts.prompt_len, facts.computed, facts.scheduled, variant, n_tokens,
                     facts.full_path)


def full_token_metadata(facts: StepFacts, p: StepPlan, device) -> dict:
    """layer name -> attention metadata covering only the full tokens (requests without one
    are left out), built by each group's own builder from the step's common metadata."""
    rows = np.flatnonzero(p.full_counts > 0)  # (R',) requests with a full token
    counts = p.full_counts[rows]  # (R',)
    qsl = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)  # (R'+1,)
    rows_t = torch.from_numpy(rows).to(device)
    tok = torch.from_numpy(p.full_index).to(device)  # (F,)
    out = {}
    for group, cm in facts.groups:
        seq_lens_cpu = None if cm.seq_lens_cpu_upper_bound is None else cm.seq_lens_cpu_upper_bound[rows]
        seq = cm.seq_lens[rows_t]  # (R',)
        sub = replace(
            cm,
            query_start_loc=torch.from_numpy(qsl).to(cm.query_start_loc.device),
            query_start_loc_cpu=torch.from_numpy(qsl),
            seq_lens=seq,
            seq_lens_cpu_upper_bound=seq_lens_cpu,
            num_reqs=int(rows.size),
            num_actual_tokens=p.n_full,
            max_query_len=int(counts.max()),
            max_seq_len=int(seq.max()),
            block_table_tensor=cm.block_table_tensor[rows_t],
            slot_mapping=cm.slot_mapping[tok],
            positions=None if cm.positions is None else cm.positions[tok],
            is_prefilling=None if cm.is_prefilling is None else cm.is_prefilling[rows_t],
            req_idx=None if cm.req_idx is None else cm.req_idx[rows],
            logits_indices_padded=None, num_logits_indices=None, max_logits_per_req=None,
            _num_computed_tokens_cache=None, _token_to_req_indices_cache=None,
        )
        meta = group.build_metadata(sub)
        for name in group.layer_names:
            out[name] = meta
    return out
