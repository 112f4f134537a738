"""Token generation with POP semantics, as a generator the UI can stream.

`generate` yields one `Token` per new token; the first carries the time to first token (prompt in,
boundary step included). `run` drains it into a `Generation` with the measurements.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from pop_analysis.engine.heal import heal_prompt
from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.pop import PromptError, check_prompt, check_text, decode_step, run_prompt
from pop_analysis.engine.precision import decode_twins
from pop_analysis.errors import InputError
from pop_vllm.run_setting import RunSetting


@dataclass(frozen=True)
class SamplingConfig:
    """How to pick each next token."""

    max_new_tokens: int = 32  # upper bound on generated tokens
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept when sampling
    seed: int = 0  # sampling seed (one generator per run)
    stop_at_eos: bool = True  # end on the tokenizer's / config's EOS ids

    def __post_init__(self):
        check_sampling(self.max_new_tokens, self.temperature, self.top_p, self.seed)


class SamplingError(InputError):
    """Sampling parameters no run can use; the message says which and why."""


def check_sampling(max_new_tokens, temperature, top_p, seed=0) -> None:
    """max_new_tokens >= 1, finite temperature >= 0, finite 0 < top_p <= 1, 0 <= seed < 2**63."""
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise SamplingError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not _is_real(temperature) or not (math.isfinite(temperature) and temperature >= 0):
        raise SamplingError(f"temperature must be a finite number >= 0 (0 = greedy), "
                            f"got {temperature!r}")
    if not _is_real(top_p) or not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise SamplingError(f"top_p must be a number in (0, 1], got {top_p!r}")
    if not _is_int(seed) or not 0 <= seed < 2 ** 63:
        raise SamplingError(f"seed must be an integer in 0..2**63-1, got {seed!r}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass(frozen=True)
class Token:
    """One generated token and when it arrived."""

    token_id: int
    index: int  # 0 for the first generated token
    elapsed_s: float  # seconds since the prompt went in (synchronised)
    heal: dict | None = None  # healing so far (Healer.report) when the run heals


@dataclass
class Generation:
    """A finished run of one variant."""

    variant: str
    token_ids: list[int] = field(default_factory=list)
    ttft_s: float = 0.0  # prompt in -> first token out
    decode_s: float = 0.0  # first token out -> last token out
    text: str | None = None
    heal: dict | None = None  # what healing did (policy, chunk, horizon, ...) when the run heals

    @property
    def decode_tokens_per_s(self) -> float | None:
        n = len(self.token_ids) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else None


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def eos_ids(lm: LoadedModel) -> set[int]:
    ids: set[int] = set()
    config = lm.model.config  # an image-text config (Gemma-3) may have no eos_token_id at all
    for src in (getattr(lm.tokenizer, "eos_token_id", None), getattr(config, "eos_token_id", None),
                getattr(getattr(lm.model, "generation_config", None), "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(x) for x in src)
    return ids


def encode(lm: LoadedModel, text: str, raw: bool = False) -> list[int]:
    """Prompt text -> token ids, through the chat template unless raw or the tokenizer has none."""
    tok = lm.tokenizer
    if tok is None:
        raise ValueError(f"model {lm.name} has no tokenizer: give token ids instead of text")
    if not text or not text.strip():
        raise ValueError("the prompt is empty")
    try:
        text.encode("utf-8")  # argv holds bytes that are not UTF-8 as lone surrogates
    except UnicodeEncodeError as e:
        raise PromptError(f"the prompt is not UTF-8 text (character {e.start + 1})") from None
    check_text(lm.adapter, len(text))
    if not raw and getattr(tok, "chat_template", None):
        out = tok.apply_chat_template([{"role": "user", "content": text}],
                                      add_generation_prompt=True, tokenize=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return list(ids[0] if ids and isinstance(ids[0], list) else ids)
    return tok(text, add_special_tokens=True)["input_ids"]


NUCLEUS_CANDIDATES = 256  # probabilities ranked by topk before falling back to a full sort


def pick(logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator | None) -> torch.Tensor:
    """Next token per row of logits (B, V) -> (B, 1)."""
    if cfg.temperature <= 0:
        return logits.argmax(-1, keepdim=True)  # (B, 1)
    probs = torch.softmax(logits / cfg.temperature, dim=-1)  # (B, V)
    if cfg.top_p < 1.0:
        probs = nucleus(probs, cfg.top_p)
    return draw(probs, gen)


def draw(probs: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """One token per row with probability proportional to probs (B, V) -> (B, 1).

    Inverse CDF: one uniform per row against the running sum (float64, so a token's share of the
    interval is its probability to within 1e-16 of the total). torch.multinomial draws one
    exponential per vocabulary entry instead, about a millisecond per row for 49k tokens. A token
    of probability 0 owns an empty interval and is never drawn.
    """
    cdf = probs.to(torch.float64).cumsum(-1)  # (B, V)
    u = torch.rand(probs.shape[0], 1, generator=gen, dtype=torch.float64,
                   device=probs.device) * cdf[:, -1:]  # (B, 1), uniform on [0, total)
    idx = torch.searchsorted(cdf, u, right=True)  # (B, 1): first entry whose running sum > u
    past = idx[:, 0] >= probs.shape[-1]  # u rounded up to the total: the last token that can win
    if bool(past.any()):
        last = probs.shape[-1] - 1 - (probs[past].flip(-1) > 0).int().argmax(-1)  # (b,)
        idx[past, 0] = last
    return idx


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero all but the smallest prefix of the descending probabilities whose mass reaches top_p.

    Sorting SmolLM2's 49k probabilities takes about 25x as long as a topk of 256 on the CPU here.
    The K largest (topk, also descending) hold the same prefix, with the same running sums,
    whenever the prefix ends inside them, which the last candidate being dropped proves. Flat
    rows take the full sort.
    """
    k = min(NUCLEUS_CANDIDATES, probs.shape[-1])
    top, order = probs.topk(k, dim=-1)  # (B, K) each, descending
    drop = top.cumsum(-1) - top > top_p  # (B, K): keep the smallest prefix reaching top_p
    if k < probs.shape[-1] and not bool(drop[:, -1].all()):
        top, order = probs.sort(dim=-1, descending=True)  # (B, V)
        drop = top.cumsum(-1) - top > top_p
    return torch.zeros_like(probs).scatter(-1, order, top.masked_fill(drop, 0.0))  # (B, V)


def generate(lm: LoadedModel, prompt_ids: list[int], setting: RunSetting,
             cfg: SamplingConfig = SamplingConfig(), counts=None):
    """Yield the new tokens of one run setting one by one (a generator: the UI streams it).

    `counts` (from counters.count_calls) is told the stage: prefill, boundary, decode (and heal
    while a healing chunk runs). `heal` (pop_vllm.healing) heals the pruned prompt's cache
    between decode steps, after the first token; each Token then carries the healing so far.
    The setting's int8 layers (engine/precision.py) run the prompt only; decode stays fp32.
    """
    setting.check(lm.adapter.n_layers)
    check_prompt(lm.adapter, len(prompt_ids), cfg.max_new_tokens)
    adapter = lm.adapter
    device = adapter.device
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed) if cfg.temperature > 0 else None
    stop = eos_ids(lm) if cfg.stop_at_eos else set()
    drop = setting.decode_drop
    ids = torch.tensor([prompt_ids], device=device)  # (1, N)
    synchronize(device)
    t0 = time.perf_counter()
    first, healer = heal_prompt(adapter, ids, setting, counts)  # no healer unless it heals
    twins = decode_twins(adapter, setting.precision)  # {} unless uniform int8 (a baseline)
    if counts is not None:
        counts.stage = "decode"
    nxt = pick(first.logits.cpu(), cfg, gen)  # (1, 1)
    position = first.position
    for index in range(cfg.max_new_tokens):
        synchronize(device)
        token = int(nxt[0, 0])
        yield Token(token, index, time.perf_counter() - t0, healer and healer.report())
        if token in stop or index + 1 == cfg.max_new_tokens:
            return
        if healer is None:
            logits = decode_step(adapter, nxt.to(device), first.cache, position, drop,
                                 twins=twins)  # (1, V)
        else:
            healer.before_step(index + 1, counts)
            logits = healer.decode(nxt.to(device), position)  # (1, V)
        position += 1
        nxt = pick(logits.cpu(), cfg, gen)


def run(lm: LoadedModel, prompt_ids: list[int], setting: RunSetting,
        cfg: SamplingConfig = SamplingConfig(), on_token=None, counts=None) -> Generation:
    """Drain `generate` into a Generation; `on_token(Token)` sees each token as it arrives."""
    out = Generation(variant=setting.variant)
    last = 0.0
    for tok in generate(lm, prompt_ids, setting, cfg, counts):
        out.heal = tok.heal
        if tok.index == 0:
            out.ttft_s = tok.elapsed_s
        out.token_ids.append(tok.token_id)
        last = tok.elapsed_s
        if on_token is not None:
            on_token(tok)
    out.decode_s = last - out.ttft_s
    if lm.tokenizer is not None:
        out.text = lm.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    return out
