"""Representation drift: how far POP's internals move from the full model's on the same input.

Both runs see the same token sequence: the prompt, then the full model's greedy tokens fed to
both (teacher forcing), so every difference comes from the pruned prefill alone. Per layer:

    hidden    the layer's output at prompt positions 1..N-1 (for a layer POP skips, the value the
              runtime passes on: the output of the last kept layer before it)
    k, v      the cache entries of positions 1..N-1 as cached (post-RoPE, post-k_norm keys)
    attn_out  the attention output (input of o_proj) at x_N and the next K-1 tokens
    kl, top1  KL(full || pop) of each of the K next-token distributions, and argmax agreement

Cosine similarity is taken per token, then summarised per layer (mean, min, quantiles).
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch

from pop_analysis.engine.adapter import DecoderAdapter
from pop_analysis.engine.hooks import Hooks
from pop_analysis.engine.pop import check_prompt, decode_step, repair_maps, run_prompt
from pop_analysis.errors import InputError
from pop_analysis.progress import Tracker
from pop_analysis.store import results as store
from pop_analysis.store.records import check
from pop_analysis.store.schema import Record
from pop_vllm.run_setting import RunSetting

if TYPE_CHECKING:
    from pop_analysis.engine.models import LoadedModel

KIND = "drift"  # store kind of single-prompt results
KIND_BY_LENGTH = "drift_by_length"  # store kind of drift-vs-length curves
QUANTITIES = ("hidden", "k", "v", "attn_out")
QUANTILES = (0.1, 0.25, 0.5)  # low quantiles: drift lives in the lower tail


class DriftError(InputError):
    """An input drift cannot measure (too short a prompt, no tokenizer, no text)."""


@dataclass(frozen=True)
class DriftConfig:
    """What a drift run measures."""

    decode_steps: int = 8  # K: next-token distributions compared (x_N + K-1 teacher-forced tokens)
    max_tokens_plot: int = 256  # heatmap columns at most; longer prompts are averaged in bins


@dataclass
class DriftResult(Record):
    """Cosine similarity POP vs full, per layer and per token, plus next-token agreement."""

    model: str
    skip_layers: list[int]
    n_layers: int
    prompt_tokens: int  # N (the matrices cover positions 1..N-1)
    hidden_cos: list[float]  # (L,) mean over prompt positions
    k_cos: list[float]
    v_cos: list[float]
    attn_out_cos: list[float]  # (L,) mean over the K decode steps
    hidden_min: list[float]  # (L,) worst token
    k_min: list[float]
    v_min: list[float]
    attn_out_min: list[float]
    hidden_tok: list[list[float]]  # (L, T') per-token cosine, T' <= max_tokens_plot
    k_tok: list[list[float]]
    v_tok: list[list[float]]
    attn_out_tok: list[list[float]]  # (L, K)
    kl: list[float]  # (K,) KL(full || pop) in nats
    top1_agree: list[float]  # (K,) 1.0 where both argmaxes agree (a fraction when averaged)
    tokens: list[str] | None  # first prompt token of each heatmap column
    token_positions: list[int] = field(default_factory=list)  # first position of each column
    quantiles: dict = field(default_factory=dict)  # {"hidden": {"0.1": [L], ...}, ...}
    decode_tokens: list[int] = field(default_factory=list)  # the full model's greedy tokens
    n_prompts: int = 1  # >1 when averaged over prompts (matrices then from the first prompt)
    config: dict = field(default_factory=dict)
    seconds: float = 0.0
    variant: str = "pop"  # what ran against the full model (pop, or pop_repair)

    def block_means(self) -> dict:
        """Mean cosine over the skipped layers (all layers when none are skipped)."""
        layers = self.skip_layers or list(range(self.n_layers))
        return {f"{q}_cos": _mean(getattr(self, f"{q}_cos")[i] for i in layers)
                for q in QUANTITIES}


# --- recording -------------------------------------------------------------------------------

class _Recorder:
    """One run's recordings. `stage` is set by run_prompt (it takes us as its `counts`)."""

    def __init__(self, n_prefill: int):
        self.n_prefill = n_prefill  # positions 1..N-1
        self.stage = "prefill"
        self.hidden: dict[int, torch.Tensor] = {}  # layer -> (T, D), prefill stage only
        self.attn: dict[int, list[torch.Tensor]] = defaultdict(list)  # layer -> [(F,)] per call

    def on_layer(self, i, _module, _args, output):
        if self.stage == "prefill":
            h = output[0] if isinstance(output, tuple) else output  # (B, T, D)
            self.hidden[i] = h[0, : self.n_prefill].detach()  # (T, D)

    def on_o_proj(self, i, _module, args):
        self.attn[i].append(args[0][0, -1].detach())  # (F,) last position of this call

    def attn_out(self, i: int, k: int) -> torch.Tensor:
        # The last K calls are x_N (last position of the full prefill, or POP's boundary step)
        # and the K-1 decode steps; earlier entries belong to POP's prefill chunk.
        return torch.stack(self.attn[i][-k:])  # (K, F)


@contextmanager
def recording(adapter: DecoderAdapter, n_prefill: int):
    """Hook every layer's output and every o_proj input while the block runs."""
    rec = _Recorder(n_prefill)
    with Hooks() as hooks:
        for i in range(adapter.n_layers):
            hooks.after(adapter.layers[i], partial(rec.on_layer, i))
            hooks.before(adapter.o_proj(i), partial(rec.on_o_proj, i))
        yield rec


@dataclass
class _Run:
    """What one run leaves for the comparison."""

    hidden: list[torch.Tensor]  # L x (T, D)
    k: list[torch.Tensor]  # L x (T, Hkv*Dh)
    v: list[torch.Tensor]  # L x (T, Hkv*Dh)
    attn_out: list[torch.Tensor]  # L x (K, F)
    logits: torch.Tensor  # (K, V)
    fed: list[int] = field(default_factory=list)  # the K-1 tokens fed after the prompt


@torch.inference_mode()
def _run(adapter: DecoderAdapter, ids: torch.Tensor, setting: RunSetting, feed, steps: int,
         tick) -> _Run:
    """Prompt + K-1 decode steps of one setting; `feed` is None to pick greedy tokens."""
    n = ids.shape[1]
    variant = setting.variant
    with recording(adapter, n - 1) as rec:
        first = run_prompt(adapter, ids, setting, counts=rec)
        kv = [_prompt_kv(adapter, first.cache, i, n) for i in range(adapter.n_layers)]
        rec.stage = "decode"
        tick(f"{variant}: prompt")
        logits, fed, pos = [first.logits[0]], [], first.position  # [(V,)]
        for j in range(steps - 1):
            tok = int(logits[-1].argmax()) if feed is None else feed[j]
            fed.append(tok)
            nxt = torch.tensor([[tok]], device=ids.device)  # (1, 1)
            logits.append(decode_step(adapter, nxt, first.cache, pos)[0])  # (V,)
            pos += 1
            tick(f"{variant}: decode {j + 1}/{steps - 1}")
    attn = [rec.attn_out(i, steps) for i in range(adapter.n_layers)]  # L x (K, F)
    return _Run(_pass_through(adapter, ids[:, : n - 1], rec.hidden), [k for k, _ in kv],
                [v for _, v in kv], attn, torch.stack(logits), fed)  # logits (K, V)


def _prompt_kv(adapter, cache, i: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer i's cached K and V of prompt positions 1..N-1 after the N prompt tokens went in,
    each (N-1, Hkv*Dh). A sliding-window layer keeps only its last keys: the positions it dropped
    are NaN rows (left out of the statistics)."""
    out = []
    for x in adapter.cached_kv(cache, i):  # (1, Hkv, S, Dh)
        x = _per_token(x[0])  # (S, Hkv*Dh)
        first = n - x.shape[0]  # position of the first cached entry
        if first <= 0:
            out.append(x[: n - 1])  # (N-1, Hkv*Dh)
            continue
        rows = x.new_full((n - 1, x.shape[1]), float("nan"))  # (N-1, Hkv*Dh)
        rows[first:] = x[: n - 1 - first]
        out.append(rows)
    return out[0], out[1]


def _pass_through(adapter, prefill_ids, recorded: dict) -> list[torch.Tensor]:
    """Per-layer hidden state as the runtime carries it: a layer that ran no forward passes its
    input on (the embedding, or the last kept layer's output)."""
    h = adapter.embed(prefill_ids)[0]  # (T, D)
    out = []
    for i in range(adapter.n_layers):
        h = recorded.get(i, h)
        out.append(h)
    return out


def _per_token(x: torch.Tensor) -> torch.Tensor:
    """(Hkv, T, Dh) -> (T, Hkv*Dh): one vector per token, all heads together."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)  # (T, Hkv*Dh)


# --- comparison ------------------------------------------------------------------------------

def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine (..., F) x (..., F) -> (...), in float64; two zero vectors count as 1."""
    a, b = a.double(), b.double()
    na, nb = a.norm(dim=-1), b.norm(dim=-1)  # (...)
    cos = (a * b).sum(-1) / (na * nb).clamp_min(1e-300)  # (...)
    both_zero = (na == 0) & (nb == 0)
    return torch.where(both_zero, torch.ones_like(cos), cos).clamp(-1.0, 1.0)


def kl_full_pop(full: torch.Tensor, pop: torch.Tensor) -> torch.Tensor:
    """KL(full || pop) per row of logits (K, V) -> (K,), in nats."""
    lp = torch.log_softmax(full.double(), -1)  # (K, V)
    lq = torch.log_softmax(pop.double(), -1)  # (K, V)
    return (lp.exp() * (lp - lq)).sum(-1).clamp_min(0.0)  # (K,)


def column_bins(n: int, max_cols: int) -> list[torch.Tensor]:
    """Split positions 0..n-1 into at most max_cols contiguous, near-equal bins."""
    return list(torch.arange(n).tensor_split(max(1, min(n, max_cols))))


def _downsample(m: torch.Tensor, bins) -> torch.Tensor:
    """(L, T) -> (L, T') bin means (NaN entries left out)."""
    if len(bins) == m.shape[1]:
        return m
    return torch.stack([m[:, b].nanmean(1) for b in bins], 1)  # (L, T')


def _compare(full: _Run, pop: _Run, cfg: DriftConfig) -> dict:
    """Per-token cosines of both runs, summarised per layer."""
    out: dict = {"quantiles": {}}
    bins = column_bins(full.hidden[0].shape[0], cfg.max_tokens_plot)
    for q in QUANTITIES:
        # layers may sit on different devices (device_map): gather the cosines on the host
        pairs = zip(getattr(full, q), getattr(pop, q))
        tok = torch.stack([cosine(a, b).cpu() for a, b in pairs])  # (L, T)
        out[f"{q}_cos"] = tok.nanmean(1).tolist()
        worst = tok.nan_to_num(nan=float("inf")).min(1).values  # (L,)
        out[f"{q}_min"] = worst.masked_fill(worst.isinf(), float("nan")).tolist()
        qs = torch.nanquantile(tok, torch.tensor(QUANTILES, dtype=tok.dtype), dim=1)  # (Q, L)
        out["quantiles"][q] = {str(p): row.tolist() for p, row in zip(QUANTILES, qs)}
        out[f"{q}_tok"] = (tok if q == "attn_out" else _downsample(tok, bins)).tolist()
    out["kl"] = kl_full_pop(full.logits, pop.logits).tolist()
    out["top1_agree"] = (full.logits.argmax(-1) == pop.logits.argmax(-1)).double().tolist()  # (K,)
    out["token_positions"] = [int(b[0]) for b in bins]
    return out


# --- public API ------------------------------------------------------------------------------

def drift(lm: LoadedModel, prompt_ids: list[int], setting: RunSetting,
          cfg: DriftConfig = DriftConfig(), progress=None) -> DriftResult:
    """Full model vs POP (or pop_repair) on one prompt; `progress` gets a Progress per
    prompt/decode step."""
    n_steps = 2 * cfg.decode_steps
    tracker = Tracker(n_steps, progress, "drift")
    return _drift(lm, prompt_ids, setting, cfg, lambda msg: tracker.step(1, msg))


def _drift(lm: LoadedModel, prompt_ids, setting: RunSetting, cfg: DriftConfig,
           tick) -> DriftResult:
    t0 = time.perf_counter()
    adapter = lm.adapter
    _check(adapter, len(prompt_ids), setting, cfg)
    ids = torch.tensor([list(prompt_ids)], device=adapter.device)  # (1, N)
    full = _run(adapter, ids, RunSetting.full(), None, cfg.decode_steps, tick)
    pop = _run(adapter, ids, setting, full.fed, cfg.decode_steps, tick)
    stats = _compare(full, pop, cfg)
    greedy = full.fed + [int(full.logits[-1].argmax())]
    return DriftResult(
        model=lm.name, skip_layers=list(setting.skip), n_layers=adapter.n_layers,
        prompt_tokens=len(prompt_ids), tokens=_token_strings(lm, prompt_ids,
                                                             stats["token_positions"]),
        decode_tokens=greedy, config=asdict(cfg), seconds=time.perf_counter() - t0,
        variant=str(setting.variant), **stats)


def _check(adapter: DecoderAdapter, n: int, setting: RunSetting, cfg: DriftConfig) -> None:
    if cfg.decode_steps < 1:
        raise DriftError(f"decode_steps must be at least 1, got {cfg.decode_steps}")
    if cfg.max_tokens_plot < 1:
        raise DriftError(f"max_tokens_plot must be at least 1, got {cfg.max_tokens_plot}")
    if n < 2:
        raise DriftError(f"drift needs a prompt of at least 2 tokens (x_1..x_(N-1) is the pruned "
                         f"prefill), got {n}")
    _comparable(setting).check(adapter.n_layers)
    check_prompt(adapter, n, cfg.decode_steps)


def _comparable(setting: RunSetting) -> RunSetting:
    if setting.variant not in ("pop", "pop_repair"):
        raise DriftError(f"drift compares pop or pop_repair with the full model, not "
                         f"{str(setting.variant)!r}")
    return setting


def _token_strings(lm: LoadedModel, ids, positions) -> list[str] | None:
    if lm.tokenizer is None:
        return None
    return [lm.tokenizer.decode([ids[p]]) for p in positions]


def average(results: list[DriftResult]) -> DriftResult:
    """Several prompts' results in one: means averaged, minima of minima, steps averaged.

    Prompt-position matrices and quantiles differ in length per prompt: they come from the first.
    """
    if not results:
        raise DriftError("nothing to average: no drift results")
    first = results[0]
    if any(r.n_layers != first.n_layers or r.skip_layers != first.skip_layers
           or r.variant != first.variant for r in results):
        raise DriftError("cannot average drift results of different models, skip sets or "
                         "variants")
    out = DriftResult.from_dict(first.to_dict())
    for q in QUANTITIES:
        setattr(out, f"{q}_cos", _col_mean([getattr(r, f"{q}_cos") for r in results]))
        setattr(out, f"{q}_min", [min(_nums(c), default=float("nan"))
                                  for c in zip(*(getattr(r, f"{q}_min") for r in results))])
    k = min(len(r.kl) for r in results)
    out.attn_out_tok = [_col_mean([r.attn_out_tok[i][:k] for r in results])
                        for i in range(first.n_layers)]
    out.kl = _col_mean([r.kl[:k] for r in results])
    out.top1_agree = _col_mean([r.top1_agree[:k] for r in results])
    out.n_prompts = sum(r.n_prompts for r in results)
    out.seconds = sum(r.seconds for r in results)
    return out


def _col_mean(rows: list[list[float]]) -> list[float]:
    return [_mean(c) for c in zip(*rows)]


def _nums(xs) -> list[float]:
    """The numbers among xs: NaN (in memory) and None (NaN after JSON) are left out."""
    return [x for x in xs if x is not None and x == x]


def _mean(xs) -> float:
    xs = _nums(xs)
    return sum(xs) / len(xs) if xs else float("nan")


# --- cache -----------------------------------------------------------------------------------

def _model_params(lm: LoadedModel) -> dict:
    s = lm.adapter.shape
    return {"model": lm.name, "dtype": str(lm.dtype), "layers": s.n_layers, "hidden": s.hidden,
            "vocab": s.vocab}


def cached_drift(lm: LoadedModel, prompt_ids, setting: RunSetting,
                 cfg: DriftConfig = DriftConfig(), use_cache: bool = True, progress=None,
                 notice=None) -> tuple[DriftResult, bool]:
    """drift() through the results store; the bool says whether it was a cache hit.
    notice(line) hears about an ignored entry or a cache that cannot be written."""
    ids = [int(t) for t in prompt_ids]
    params = {**_model_params(lm), "prompt_sha": store.content_sha(ids), "prompt_tokens": len(ids),
              "skip": list(setting.skip), "config": asdict(cfg), **_variant_params(lm, setting)}
    expect = {"model": lm.name, "prompt_tokens": len(ids), "skip_layers": params["skip"]}
    payload, hit = store.cached(
        KIND, params, lambda: drift(lm, ids, setting, cfg, progress).to_dict(), use_cache,
        lambda p: check(KIND, DriftResult, p, lm.adapter.n_layers, expect), notice)
    return DriftResult.from_dict(payload), hit


def _variant_params(lm: LoadedModel, setting: RunSetting) -> dict:
    """Key parts of pop_repair: the repair in use (none for pop: earlier entries stay valid)."""
    if _comparable(setting).variant == "pop":
        return {}
    return {"variant": str(setting.variant), "repair": repair_maps(lm.adapter, setting.skip).tag}


def list_drifts() -> list[dict]:
    return store.entries(KIND)


def load_drift(key: str) -> DriftResult | None:
    return store.load_record(KIND, key, DriftResult)


__all__ = ["DriftConfig", "DriftResult", "DriftError", "drift", "cached_drift", "average", "cosine",
           "kl_full_pop", "list_drifts", "load_drift"]
