"""The full model beside a POP variant on one prompt: the tokens each generates, the per-layer
call counts by stage, the streamed arrival times, and the prefill speedup measured by the timing
protocol on the same prompt ids. The Generate page streams the two runs token by token through
`run_variant`; `compare` does the whole thing for the CLI and the stored examples.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from pop_analysis.engine.counters import count_calls
from pop_analysis.engine.generate import SamplingConfig, generate
from pop_analysis.engine.models import LoadedModel
from pop_analysis.speed.bench import time_prefill
from pop_analysis.speed.timing import TimingConfig
from pop_analysis.store import results as store
from pop_analysis.store.records import check
from pop_analysis.store.schema import Record
from pop_vllm.run_setting import RunSetting

KIND = "generation"
TIMING = TimingConfig(min_rounds=3, budget_s=2.0, warmup=0)  # the two runs have just warmed up


@dataclass
class GenerationResult(Record):
    """One side-by-side generation, as the Generate page shows it."""

    model: str
    prompt: str  # the text typed
    prompt_ids: list[int]  # what went in (chat template applied unless raw)
    engine: str  # the pop.py variant beside the full model
    label: str  # its name on the page ("POP (independent KV + boundary)")
    short: str  # its short name ("POP")
    skip_layers: list[int]
    settings: dict  # decoding settings, as the page's "Made from" line names them
    full: dict  # run_variant() of the full model
    other: dict  # run_variant() of the variant
    full_text: str  # the full model's output as text (special tokens left out)
    other_text: str
    speed: dict | None = None  # PrefillSpeed.to_dict(): TTFT full vs variant by the protocol


@dataclass(frozen=True)
class Caption:
    """How a generation is named where it is shown: the text typed, the variant's label and
    short name, and the decoding settings of the page's "Made from" line."""

    prompt: str
    label: str  # "POP (independent KV + boundary)"
    short: str  # "POP"
    settings: dict


def run_variant(lm: LoadedModel, prompt_ids: list[int], setting: RunSetting, cfg: SamplingConfig,
                on_token=None) -> dict:
    """One setting with call counting on; `on_token(ids_so_far)` after each token. When the
    setting heals, the result's "heal" holds what healing did (engine/heal.py's report)."""
    ids: list[int] = []
    times: list[float] = []
    report = None
    with count_calls(lm.adapter) as counts:
        for tok in generate(lm, prompt_ids, setting, cfg, counts=counts):
            ids.append(tok.token_id)
            times.append(tok.elapsed_s)
            report = tok.heal
            if on_token is not None:
                on_token(ids)
    ttft = times[0] if times else 0.0
    decode_s = times[-1] - ttft if times else 0.0
    return {"variant": str(setting.variant), "skip": list(setting.skip), "token_ids": ids,
            "times": times,
            "ttft_s": ttft, "decode_s": decode_s,
            "decode_tok_s": (len(ids) - 1) / decode_s if len(ids) > 1 and decode_s > 0 else None,
            "counts": counts.as_dict(), "heal": report}


def text_of(lm: LoadedModel, ids: list[int]) -> str:
    return lm.tokenizer.decode(ids, skip_special_tokens=True) if lm.tokenizer else ""


def compare(lm: LoadedModel, ids: list[int], setting: RunSetting, cfg: SamplingConfig,
            caption: Caption, timing: TimingConfig = TIMING) -> GenerationResult:
    """Full model, then `setting`, on the same prompt ids; then the protocol on them."""
    full = run_variant(lm, ids, RunSetting.full(), cfg)
    other = run_variant(lm, ids, setting, cfg)
    speed = time_prefill(lm, torch.tensor([ids], device=lm.device), setting, timing)
    return GenerationResult(lm.name, caption.prompt, list(ids), str(setting.variant),
                            caption.label, caption.short, list(setting.skip),
                            dict(caption.settings), full, other, text_of(lm, full["token_ids"]),
                            text_of(lm, other["token_ids"]), speed.to_dict())


def cached_generation(lm: LoadedModel, ids: list[int], setting: RunSetting, cfg: SamplingConfig,
                      caption: Caption, use_cache: bool = True,
                      notice=None) -> tuple[GenerationResult, bool]:
    """compare() through the results store (the caption is not part of the key)."""
    params = {"model": lm.name, "card": lm.card(), "prompt_ids": list(ids),
              "variant": str(setting.variant), "skip": list(setting.skip), "sampling": asdict(cfg)}
    payload, hit = store.cached(
        KIND, params, lambda: compare(lm, ids, setting, cfg, caption).to_dict(), use_cache,
        lambda p: check(KIND, GenerationResult, p, lm.adapter.n_layers, {"model": lm.name}),
        notice)
    return GenerationResult.from_dict(payload), hit
