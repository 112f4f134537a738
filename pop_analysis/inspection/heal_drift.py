"""Drift while healing: after the first token and after every decode step of a healing run, how
far each layer's cached K and V of the prompt positions are from the full model's (1 - cosine,
averaged over the positions both caches hold). It starts at plain POP's drift and falls to 0,
layer by layer, as the healed prefix grows (docs/healing.md)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pop_analysis.engine.heal import heal_greedy, heal_prompt
from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.pop import check_prompt, teacher_force
from pop_analysis.store import results as store
from pop_analysis.store.records import check
from pop_analysis.store.schema import Record
from pop_vllm.run_setting import RunSetting

KIND = "heal_drift"  # store kind (and the stored example's kind)


@dataclass
class HealDrift(Record):
    model: str
    prompt_tokens: int
    skip_layers: list[int]
    heal: dict  # the settings (policy, chunk, budget)
    tokens_out: list[int] = field(default_factory=list)  # after the first token, then each step
    k: list[list[float]] = field(default_factory=list)  # [step][layer] 1 - cos of prompt keys
    v: list[list[float]] = field(default_factory=list)  # [step][layer] 1 - cos of prompt values
    healed: list[int] = field(default_factory=list)  # positions healed after each step
    horizon: int | None = None  # tokens out when the cache became the full model's


@torch.inference_mode()
def healing_drift(lm: LoadedModel, prompt_ids: list[int], setting: RunSetting,
                  n_new: int = 16) -> HealDrift:
    """Run `setting` (POP with its healing) for n_new greedy tokens and record the prompt rows'
    drift per step."""
    a = lm.adapter
    check_prompt(a, len(prompt_ids), n_new)
    ids = torch.tensor([prompt_ids], device=a.device)  # (1, N)
    n = len(prompt_ids)
    ref = a.new_cache()
    teacher_force(a, ids, ref, 0)  # the full model's rows of the prompt positions
    first, healer = heal_prompt(a, ids, setting)
    out = HealDrift(lm.name, n, list(setting.skip), setting.heal.as_dict())
    layers = range(a.n_layers)

    def record(tokens_out: int) -> None:
        rows = [_prompt_rows(a, first.cache, ref, i, n) for i in layers]
        out.tokens_out.append(tokens_out)
        out.k.append([_cos_gap(g[0], w[0]) for g, w in rows])
        out.v.append([_cos_gap(g[1], w[1]) for g, w in rows])
        out.healed.append(healer.done if healer else 0)

    heal_greedy(a, first, healer, n_new, record)
    out.horizon = healer.horizon if healer else None
    return out


def cached_healing_drift(lm: LoadedModel, prompt_ids, setting: RunSetting, n_new: int = 16,
                         use_cache: bool = True, notice=None) -> tuple[HealDrift, bool]:
    """healing_drift() through the results store; the bool says whether it was a cache hit."""
    ids = [int(t) for t in prompt_ids]
    params = {"model": lm.name, "dtype": str(lm.dtype), "layers": lm.adapter.n_layers,
              "prompt_sha": store.content_sha(ids),
              "prompt_tokens": len(ids), "skip": list(setting.skip),
              "heal": setting.heal.as_dict(), "new_tokens": n_new}
    expect = {"model": lm.name, "prompt_tokens": len(ids), "skip_layers": params["skip"]}
    payload, hit = store.cached(
        KIND, params, lambda: healing_drift(lm, ids, setting, n_new).to_dict(), use_cache,
        lambda p: check(KIND, HealDrift, p, lm.adapter.n_layers, expect), notice)
    return HealDrift.from_dict(payload), hit


def _prompt_rows(a, cache, ref, i: int, n: int):
    """Layer i's (K, V) rows of the prompt positions both caches hold: (B, Hkv, P, Dh) each."""
    got, want = a.cached_kv(cache, i), a.cached_kv(ref, i)
    lo_got = a.seen_length(cache, i) - got[0].shape[-2]  # first position the healed run holds
    lo = max(lo_got, n - want[0].shape[-2])
    pick = lambda kv, lo_kv: tuple(t[:, :, lo - lo_kv:n - lo_kv] for t in kv)  # noqa: E731
    return pick(got, lo_got), pick(want, n - want[0].shape[-2])


def _cos_gap(g: torch.Tensor, w: torch.Tensor) -> float:
    """1 - mean over positions of the cosine between two rows (B, Hkv, P, Dh); 0 when none."""
    if g.shape[-2] == 0:
        return 0.0
    rows = lambda t: t.transpose(1, 2).flatten(2)  # noqa: E731  (B, P, Hkv*Dh)
    cos = torch.nn.functional.cosine_similarity(rows(g).float(), rows(w).float(), dim=-1)  # (B, P)
    return float((1.0 - cos).mean().clamp_min(0.0))
