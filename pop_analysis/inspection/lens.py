"""Logit lens: where in the stack each generated token becomes the model's choice, and the
next-token candidates at any step, for the full model and for a POP variant.

The lens reads layer l's output hidden state through the model's own final norm and lm_head, as
if the stack ended there. The last layer's lens is the model's own next-token distribution.
For a token t of a generation, the states are those of the position that predicts it: x_N for
the first token (POP's boundary step), then each generated token. Under POP those positions run
every layer, but they attend to the pruned prompt's K/V, so their lens differs from the full
model's: where a POP answer departs, the lens shows at which depth it decided otherwise.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch

from pop_analysis.engine.adapter import DecoderAdapter
from pop_analysis.engine.hooks import Hooks
from pop_analysis.engine.pop import check_prompt, run_prompt, teacher_force
from pop_vllm.run_setting import RunSetting

if TYPE_CHECKING:
    from pop_analysis.engine.models import LoadedModel

FULL = RunSetting.full()
MAX_TOKENS = 64  # tokens traced at most: the lens runs lm_head once per layer and token


@dataclass
class LensTrace:
    """One variant's lens over a generated sequence (T tokens, L layers)."""

    variant: str  # pop.py variant that produced the states
    skip: list[int]  # its skip set
    tokens: list[int]  # (T,) the generated tokens traced
    first_top1: list[int | None]  # (T,) first layer whose lens ranks the token first
    commit: list[int | None]  # (T,) first layer from which it stays first up to the output
    prob: list[list[float]]  # (L, T) lens probability of the generated token per layer
    topk: list[list[tuple[int, float]]]  # (T, k) the model's own top-k (token, prob) per step


class _Record:
    """Layer outputs at the positions that predict generated tokens."""

    def __init__(self):
        self.phase = "prompt"
        self.prompt: dict[int, torch.Tensor] = {}  # layer -> (D,) its last prompt-phase output
        self.decode: dict[int, torch.Tensor] = {}  # layer -> (T-1, D) teacher-forced outputs

    def on_layer(self, i, _module, _args, output):
        h = output[0] if isinstance(output, tuple) else output  # (1, T, D)
        if self.phase == "prompt":
            self.prompt[i] = h[0, -1].detach()  # (D,) the last call ends with x_N
        else:
            self.decode[i] = h[0].detach()  # (T-1, D)


@contextmanager
def _recording(adapter: DecoderAdapter):
    rec = _Record()
    with Hooks() as hooks:
        for i in range(adapter.n_layers):
            hooks.after(adapter.layers[i], partial(rec.on_layer, i))
        yield rec


@torch.inference_mode()
def layer_states(adapter: DecoderAdapter, prompt_ids: list[int], generated: list[int],
                 setting: RunSetting = FULL) -> torch.Tensor:
    """(L, T, D): layer outputs at x_N and at generated tokens 0..T-2, the positions that
    predict generated tokens 0..T-1. A layer that did not run (skipped, dropped) passes its
    input on, as the runtime does."""
    check_prompt(adapter, len(prompt_ids), len(generated))
    ids = torch.tensor([list(prompt_ids)], device=adapter.device)  # (1, N)
    with _recording(adapter) as rec:
        first = run_prompt(adapter, ids, setting)
        rec.phase = "decode"
        if len(generated) > 1:
            fed = torch.tensor([list(generated[:-1])], device=adapter.device)  # (1, T-1)
            teacher_force(adapter, fed, first.cache, first.position, setting.decode_drop)
    h_prompt = adapter.embed(ids[:, -1:])[0, 0]  # (D,) layer 0's input at x_N
    h_dec = adapter.embed(torch.tensor([list(generated[:-1])], device=adapter.device))[0] \
        if len(generated) > 1 else None  # (T-1, D)
    out = []
    for i in range(adapter.n_layers):
        h_prompt = rec.prompt.get(i, h_prompt).to(adapter.device)  # (D,)
        if h_dec is not None:
            h_dec = rec.decode.get(i, h_dec).to(adapter.device)  # (T-1, D)
            out.append(torch.cat([h_prompt[None], h_dec]))  # (T, D)
        else:
            out.append(h_prompt[None])  # (1, D)
    return torch.stack(out)  # (L, T, D)


@torch.inference_mode()
def trace(lm: LoadedModel, prompt_ids: list[int], generated: list[int],
          setting: RunSetting = FULL, k: int = 5, max_tokens: int = MAX_TOKENS) -> LensTrace:
    """The lens of one setting over (the first `max_tokens` of) a generated sequence."""
    if not generated:
        raise ValueError("nothing generated to trace")
    gen = list(generated[:max_tokens])
    adapter = lm.adapter
    states = layer_states(adapter, prompt_ids, gen, setting)  # (L, T, D)
    target = torch.tensor(gen)  # (T,)
    top1, prob = [], []
    for i in range(adapter.n_layers):
        logits = adapter.logits(states[i][None]).float()[0].cpu()  # (T, V)
        p = torch.softmax(logits, dim=-1)  # (T, V)
        top1.append(logits.argmax(-1) == target)  # (T,)
        prob.append(p.gather(1, target[:, None])[:, 0].tolist())  # (T,)
    final = torch.topk(p, min(k, p.shape[-1]), dim=-1)  # values, indices: (T, k)
    is_top = torch.stack(top1)  # (L, T)
    return LensTrace(str(setting.variant), list(setting.skip), gen,
                     [first_layer(is_top[:, t]) for t in range(len(gen))],
                     [commit_layer(is_top[:, t]) for t in range(len(gen))], prob,
                     [list(zip(final.indices[t].tolist(), final.values[t].tolist()))
                      for t in range(len(gen))])


def first_layer(is_top: torch.Tensor) -> int | None:
    """First layer where the token is the lens's top-1 (None: never)."""
    hits = is_top.nonzero()
    return int(hits[0, 0]) if len(hits) else None


def commit_layer(is_top: torch.Tensor) -> int | None:
    """First layer from which the token stays top-1 through the last layer (None: the model's
    own output does not rank it first, e.g. a sampled token)."""
    if not bool(is_top[-1]):
        return None
    misses = (~is_top).nonzero()
    return int(misses[-1, 0]) + 1 if len(misses) else 0


def top_candidates(lm: LoadedModel, trace_: LensTrace, step: int) -> list[tuple[str, float]]:
    """The model's top-k next tokens at `step` as (text, probability) for display."""
    pairs = trace_.topk[step]
    tok = lm.tokenizer
    return [(tok.decode([t]) if tok is not None else f"[{t}]", p) for t, p in pairs]
