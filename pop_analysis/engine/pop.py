"""POP inference: pruned prefill with independent KV, boundary handling, full decode.

Prefill and decode are separate small functions with explicit positions; one cache object holds
every layer's K/V for the whole run. A run's skip set and variant come as one checked value, a
`RunSetting` (pop_vllm/run_setting.py). Variants (for the paper's ablations):

    full             every layer, every position (the unmodified model)
    pop              prefill x_1..x_{N-1}: skipped layers write independent K/V and pass h through;
                     x_N and all generated tokens run the full model
    pop_no_kv        as pop, but skipped layers write no K/V for prompt positions
    pop_no_boundary  as pop, but x_N also goes through the pruned prefill
    static           skipped layers removed in prefill AND decode (ShortGPT-style)
    pop_repair       as pop, but skipped layers project K/V with fitted maps registered on the
                     adapter for this skip set (repair.py); x_N and decode run the original weights
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pop_analysis.engine.adapter import DecoderAdapter
from pop_analysis.engine.precision import check_available, twins as int8_twins
from pop_analysis.engine.skipset import describe
from pop_analysis.errors import InputError
from pop_vllm.run_setting import RunSetting
from pop_vllm.variants import SkipMode, Variant


class PromptError(InputError):
    """A prompt the model cannot take (empty, or longer than the context)."""


class RepairError(ValueError):
    """pop_repair without fitted maps for its skip set, or maps that do not fit the model."""


def repair_maps(adapter: DecoderAdapter, skip):
    """The fitted projections registered for exactly this skip set (an adapter.KVMaps: its
    .maps are layer -> (k, v), its .tag names the repair)."""
    key = tuple(sorted(int(i) for i in skip))
    entry = adapter.kv_maps.get(key)
    if entry is None:
        have = "; ".join(describe(k) for k in adapter.kv_maps) or "none"
        raise RepairError(f"pop_repair needs a repair fitted for skip set {describe(key)} "
                          f"(registered: {have}); fit or load one (python -m pop_analysis "
                          "repair fit, or --repair auto)")
    return entry


CHARS_PER_TOKEN = 16  # a text longer than this many characters per context token cannot fit


def max_prompt_chars(adapter) -> int | None:
    """The most characters of prompt text worth tokenising for this model (None: no context
    limit known). Ordinary text runs about 4 characters a token; 16 leaves room for long tokens
    (runs of spaces, repeated symbols) while a text beyond it is refused before the tokenizer
    spends time and memory on it."""
    limit = adapter.shape.max_positions
    return CHARS_PER_TOKEN * limit if limit else None


def check_text(adapter, n_chars: int, what: str = "prompt") -> None:
    """Refuse text the context cannot hold, by its length alone (before tokenising)."""
    most = max_prompt_chars(adapter)
    if most is not None and n_chars > most:
        raise PromptError(f"the {what} is {n_chars} characters, more than the model's context of "
                          f"{adapter.shape.max_positions} tokens can hold (at most {most} "
                          "characters are tokenised)")


def check_prompt(adapter: DecoderAdapter, n_prompt: int, max_new_tokens: int = 0) -> None:
    if n_prompt < 1:
        raise PromptError("the prompt is empty: give at least one token")
    limit = adapter.shape.max_positions
    if limit and n_prompt + max(max_new_tokens, 0) > limit:
        raise PromptError(f"prompt of {n_prompt} tokens + {max_new_tokens} new tokens exceeds the "
                          f"model's context of {limit} tokens")


@dataclass(frozen=True)
class LayerPlan:
    """What one pass through the stack does with each layer (the skip set, its mode and the
    int8 copies always travel together from a setting down to the layer loop).

    mode (a SkipMode) for layers in `skip`: None runs them in full, KV writes the independent
    K/V projection of the incoming hidden state and passes it through, REPAIR does the same with
    the fitted projections registered for `skip` (see `repair_maps`), DROP does nothing.
    `twins` {layer: int8 copy} run in those layers' place.
    """

    skip: tuple = ()
    mode: SkipMode | None = None
    twins: dict = field(default_factory=dict, hash=False, compare=False)

    @classmethod
    def dropping(cls, drop=(), twins=None) -> "LayerPlan":
        """Decode's plan: `drop` removed (the static variant), every other layer in full."""
        return cls(drop, SkipMode.DROP if drop else None, twins or {})


FULL_STACK = LayerPlan()  # every layer in full, in fp32


@torch.inference_mode()
def prefill(adapter: DecoderAdapter, ids: torch.Tensor, cache, plan: LayerPlan = FULL_STACK,
            start: int = 0, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Run positions start..start+T-1 through the stack; return the last hidden state (B, 1, D).

    attention_mask (B, start+T), 1 = real token, 0 = left padding, covers every position so far;
    None means no padding.
    """
    h = _stack(adapter, ids, cache, plan, start, attention_mask)  # (B, T, D)
    return h[:, -1:, :]  # (B, 1, D)


def _stack(adapter: DecoderAdapter, ids, cache, plan: LayerPlan, start,
           attention_mask=None) -> torch.Tensor:
    """The layer loop shared by prefill and teacher forcing; returns every position (B, T, D)."""
    pad = padding(attention_mask, ids.shape[0], start + ids.shape[1])  # (B, start+T) or None
    h, pos = _embed(adapter, ids, start, pad)  # (B, T, D), (B, T)
    return run_layers(adapter, h, pos, cache, pad, range(adapter.n_layers), plan)


def _embed(adapter: DecoderAdapter, ids, start, pad):
    h = adapter.embed(ids)  # (B, T, D)
    return h, adapter.positions(start, ids.shape[1], ids.shape[0], pad)  # (B, T)


def run_layers(adapter: DecoderAdapter, h, pos, cache, pad, layers,
               plan: LayerPlan = FULL_STACK) -> torch.Tensor:
    """Run `layers` over the chunk h (B, T, D) at positions pos (B, T) with padding pad; returns
    (B, T, D). Each layer attends to what `cache` holds for it and appends the chunk's K/V
    (healing runs layers f..L-1 this way over a cache of its own). The plan's twins run their
    layers through another copy (int8 precision, int8.py).

    Each layer builds its own mask (cache lengths and sliding windows differ per layer) and
    receives h on its own device (a device_map may split the stack).
    """
    skip_mode, twins = plan.mode, plan.twins or {}
    maps = repair_maps(adapter, plan.skip).maps if skip_mode == SkipMode.REPAIR else {}
    skip = frozenset(plan.skip) if skip_mode else frozenset()
    rope = adapter.rotary(h, pos)  # cos, sin: (B, T, Dh) (per layer type on Gemma-3)
    for i in layers:
        if i not in skip:
            mask = adapter.layer_mask(i, cache, h.shape[1], pad)  # (B|1, 1, T, S+T) or None
            h = adapter.run_layer(i, h, pos, rope, cache, mask, twins.get(i))  # (B, T, D)
        elif skip_mode in (SkipMode.KV, SkipMode.REPAIR):
            k, v = adapter.project_kv(i, h, rope, maps.get(i))  # (B, Hkv, T, Dh) each
            adapter.write_kv(cache, i, k, v)
    return h


def padding(attention_mask, batch: int, n_positions: int) -> torch.Tensor | None:
    """Check a padding mask (B, positions so far); None when it pads nothing (the fast path)."""
    if attention_mask is None:
        return None
    if tuple(attention_mask.shape) != (batch, n_positions):
        raise PromptError(f"attention_mask must be (batch, positions so far) = "
                          f"({batch}, {n_positions}), got {tuple(attention_mask.shape)}")
    return None if bool(attention_mask.bool().all()) else attention_mask


def left_pad(prompts, pad_id: int = 0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists -> left-padded ids (B, N) and attention mask (B, N), 1 = real token."""
    if not prompts or min(len(p) for p in prompts) < 1:
        raise PromptError("every prompt in a batch needs at least one token")
    n = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), n), pad_id, dtype=torch.long)  # (B, N)
    mask = torch.zeros((len(prompts), n), dtype=torch.long)  # (B, N)
    for row, p in enumerate(prompts):
        ids[row, n - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[row, n - len(p):] = 1
    return ids.to(device), mask.to(device)


@torch.inference_mode()
def teacher_force(adapter: DecoderAdapter, ids: torch.Tensor, cache, position: int,
                  drop=(), attention_mask: torch.Tensor | None = None,
                  twins=None) -> torch.Tensor:
    """Feed known tokens at position.. through the stack (minus `drop`) in one chunk.

    Returns float logits for every fed position (B, T, V): logits[:, t] predicts token t+1.
    attention_mask: (B, position+T) padding mask, as in `prefill`.
    """
    h = _stack(adapter, ids, cache, LayerPlan.dropping(drop, twins), position,
               attention_mask)  # (B, T, D)
    return adapter.logits(h).float()  # (B, T, V)


@torch.inference_mode()
def decode_step(adapter: DecoderAdapter, ids: torch.Tensor, cache, position: int,
                drop=(), attention_mask: torch.Tensor | None = None, twins=None) -> torch.Tensor:
    """One token per sequence at `position` through the stack (minus `drop`); logits (B, V).

    attention_mask: (B, position+1) padding mask, as in `prefill`; `twins` only for the uniform
    int8 baseline (decode is otherwise always the original fp32 layers).
    """
    h = prefill(adapter, ids, cache, LayerPlan.dropping(drop, twins), start=position,
                attention_mask=attention_mask)
    return adapter.logits(h)[:, -1, :].float()  # (B, V)


@dataclass
class FirstStep:
    """Where the prompt leaves a run: logits of the first new token, the cache, the next position."""

    logits: torch.Tensor  # (B, V)
    cache: object
    position: int  # position of the first generated token
    attention_mask: torch.Tensor | None = None  # (B, N) padding mask of the prompt, if padded
    trunk: torch.Tensor | None = None  # (B, N, D) input of the first skipped layer (keep_trunk)


@torch.inference_mode()
def run_prompt(adapter: DecoderAdapter, ids: torch.Tensor, setting: RunSetting, counts=None,
               attention_mask: torch.Tensor | None = None,
               keep_trunk: bool = False) -> FirstStep:
    """Prompt in -> logits of the first new token out, for one setting (boundary step included).

    `counts` (a counters.CallCounts) is told the stage: "prefill", then "boundary" for x_N.
    A batch of prompts of different lengths is left-padded (see `left_pad`) with its
    attention_mask (B, N); x_N is then the last column for every row. `keep_trunk` keeps the
    hidden states entering the first skipped layer in FirstStep.trunk (exact: healing's input).
    `precision` names the layers whose prompt positions run in int8 (precision.py); x_N runs
    them in fp32.
    """
    setting.check(adapter.n_layers)
    check_available(adapter, setting)
    if setting.variant == Variant.POP_REPAIR:
        repair_maps(adapter, setting.skip)  # refuse before any work when no repair fits the set
    n = ids.shape[1]
    if attention_mask is not None and not bool(attention_mask[:, -1].bool().all()):
        raise PromptError("pad batches on the left: the last column must be a real token in "
                          "every row")
    cache = adapter.new_cache()
    am = attention_mask
    precision = setting.precision
    twins = int8_twins(adapter, precision)
    _stage(counts, "prefill")
    uniform = precision.decode_int8  # int8 for x_N too (a baseline)
    if uniform or (not setting.boundary and not twins):  # int8 prompt layers: x_N apart
        h = prefill(adapter, ids, cache, LayerPlan(setting.skip, setting.skip_mode, twins),
                    attention_mask=am)  # all N positions
        logits = adapter.logits(h)[:, -1, :].float()  # (B, V)
        return FirstStep(logits, cache, n, am)
    logits, trunk = _pruned_prompt(adapter, ids, cache, setting, am, counts)
    return FirstStep(logits, cache, n, am, trunk if keep_trunk else None)


def _pruned_prompt(adapter: DecoderAdapter, ids, cache, setting: RunSetting, am, counts):
    """POP's prompt: x_1..x_{N-1} through the pruned stack, x_N through the full one. Returns
    the first token's logits (B, V) and the hidden states entering the first skipped layer.

    Layers below the first skipped one see identical inputs in both paths, so x_N rides along
    with the prompt through them (exact, not an approximation) and the boundary step re-runs
    only layers first_skipped..L-1: the full model's result for x_N at a third of the cost.
    The same holds below the first int8 layer.
    """
    first = setting.first_changed(adapter.n_layers)
    pad = padding(am, ids.shape[0], ids.shape[1])  # (B, N) or None
    h, pos = _embed(adapter, ids, 0, pad)  # (B, N, D), (B, N)
    h = run_layers(adapter, h, pos, cache, pad, range(first))  # shared trunk, all N
    return prompt_above(adapter, h, pad, cache, setting, first, counts), h


def prompt_above(adapter: DecoderAdapter, h, pad, cache, setting: RunSetting, start: int,
                 counts=None) -> torch.Tensor:
    """Layers start..L-1 of a prompt from the hidden states entering layer `start` (B, N, D)
    with its padding pad (B, N) or None; logits of the first new token (B, V). With POP's
    boundary, x_1..x_{N-1} take the pruned stack and x_N the full one; without, all N take the
    pruned stack. Any start up to min(skip) gives the same result: below it every variant
    computes what the full model does. The setting's int8 copies run their layers for the pruned
    positions only: x_N takes the full stack."""
    rest = range(start, adapter.n_layers)
    pos = adapter.positions(0, h.shape[1], h.shape[0], pad)  # (B, N): a prompt starts at 0
    twins = int8_twins(adapter, setting.precision)  # built once per model, then looked up
    plan = LayerPlan(setting.skip, setting.skip_mode, twins)
    if not (setting.boundary or twins):  # int8 prompt layers keep x_N in fp32: a boundary too
        h = run_layers(adapter, h, pos, cache, pad, rest, plan)  # (B, N, D)
        return adapter.logits(h[:, -1:])[:, -1, :].float()  # (B, V)
    if h.shape[1] > 1:
        prompt_pad = None if pad is None else pad[:, :-1]  # (B, N-1)
        run_layers(adapter, h[:, :-1], pos[:, :-1], cache, prompt_pad, rest, plan)
    _stage(counts, "boundary")
    h_last = run_layers(adapter, h[:, -1:], pos[:, -1:], cache, pad, rest)  # x_N in full
    return adapter.logits(h_last)[:, -1, :].float()  # (B, V)


@torch.inference_mode()
def greedy_batch(adapter: DecoderAdapter, prompts, setting: RunSetting, max_new_tokens: int = 16,
                 pad_id: int = 0) -> list[list[int]]:
    """Greedy continuations of several prompts at once (left padding, one cache), no EOS stop."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    ids, mask = left_pad(prompts, pad_id, adapter.device)  # (B, N) each
    check_prompt(adapter, ids.shape[1], max_new_tokens)
    first = run_prompt(adapter, ids, setting, attention_mask=mask)
    return greedy_from(adapter, first, setting.decode_drop, max_new_tokens).tolist()


@torch.inference_mode()
def greedy_from(adapter: DecoderAdapter, first: FirstStep, drop=(), max_new_tokens: int = 16,
                stop_ids=(), twins=None) -> torch.Tensor:
    """Greedy tokens (B, T) from where `run_prompt` left a batch (its cache grows).

    With `stop_ids`, decoding ends early once every row has produced one of them (T may then be
    below max_new_tokens; a row holds further tokens after its own stop token).
    """
    mask = first.attention_mask  # (B, N) or None
    stop = torch.tensor(sorted(stop_ids), dtype=torch.long)  # (S,)
    nxt = first.logits.argmax(-1, keepdim=True)  # (B, 1)
    out, position = [nxt], first.position
    done = torch.isin(nxt.cpu(), stop)  # (B, 1)
    for _ in range(max_new_tokens - 1):
        if len(stop) and bool(done.all()):
            break
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)  # (B, position+1)
        logits = decode_step(adapter, nxt.to(adapter.device), first.cache, position, drop, mask,
                             twins)
        nxt = logits.argmax(-1, keepdim=True)  # (B, 1)
        done |= torch.isin(nxt.cpu(), stop)
        out.append(nxt)
        position += 1
    return torch.cat(out, dim=1).cpu()  # (B, T)


def _stage(counts, name: str) -> None:
    if counts is not None:
        counts.stage = name
