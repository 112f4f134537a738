"""Stage-aware layer importance from virtual gates (POP §2), with baselines and skip suggestions.

For each prompt a response is sampled from the model itself (the Fisher trick needs y ~ P(.|x)),
with a gate per sample, layer and stage, loss = SUM of cross-entropy over the response tokens, and
one backward gives dL/dg for every sample of the batch at once (sample b's loss depends on sample
b's gates only). Importance = mean over samples of (dL/dg)^2. fisher.py samples and takes the
gradients in one pass per batch; gate_gradients here is the plain teacher-forced pass over
[prompt ; response] that it must equal (tests compare them). The gated forwards record ShortGPT's
block influence; optionally an exact leave-one-layer-out pass on a few samples measures how well
the Taylor estimate ranks layers.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from pop_analysis.data.prompts import PromptOrigin, PromptSet, fingerprint
from pop_analysis.engine.generate import check_sampling, encode
from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.pop import check_prompt
from pop_analysis.importance.batch_plan import (DEFAULT_ROWS, available_bytes, plan_batches,
    rows_that_fit)
from pop_analysis.importance.compare import spearman
from pop_analysis.importance.fisher import Listeners, sample_and_gradients
from pop_analysis.importance.gates import (DECODE, StageGates, frozen_weights, gated, layer_ticks,
    maybe_block_influence, stage_map, stage_means)
from pop_analysis.importance.suggest import Suggestion, suggest_skip  # noqa: F401 - part of this module's API
from pop_analysis.progress import Cancelled, Tracker
from pop_analysis.store import results as store
from pop_analysis.store.schema import Record

KIND = "calibration"


@dataclass(frozen=True)
class CalibrationConfig:
    """What a calibration run computes; every field but batch_size changes the result."""

    n_samples: int = 16  # prompts used (the first n of the set)
    max_new_tokens: int = 64  # sampled response length bound
    temperature: float = 1.0  # sampling temperature (1.0: the model's own distribution)
    top_p: float = 1.0  # nucleus mass (1.0: the model's own distribution)
    seed: int = 0  # sample i draws from its own generator seeded from (seed, i)
    batch_size: int = DEFAULT_ROWS  # most prompts per batch; fewer if memory is short (speed only)
    loo_samples: int = 0  # exact leave-one-layer-out on this many samples; 0 = off
    raw: bool = False  # tokenise prompts as is, no chat template

    def __post_init__(self):
        if self.n_samples < 1 or self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("n_samples, max_new_tokens and batch_size must be at least 1")
        if self.loo_samples < 0:
            raise ValueError("loo_samples must be >= 0")
        check_sampling(self.max_new_tokens, self.temperature, self.top_p)  # finite, in range


@dataclass
class CalibrationResult(Record):
    """Per-layer importance per stage, with per-sample values and baselines."""

    model: str
    dataset: str
    n_samples: int
    n_layers: int
    prefill: list[float]  # mean over samples of (dL/dg_prefill)^2, per layer
    decode: list[float]  # mean over samples of (dL/dg_decode)^2, per layer
    prefill_std: list[float]  # std over samples, per layer
    decode_std: list[float]
    prefill_samples: list[list[float]]  # per sample, per layer
    decode_samples: list[list[float]]
    block_influence: dict  # {"prefill": [L], "decode": [L]}: mean 1 - cos(layer in, layer out)
    loo: dict | None  # {"prefill": [L], "decode": [L]}: mean exact loss increase, g_l = 0
    rank_corr: dict | None  # {"prefill": r, "decode": r}: Spearman, loo_taylor vs loo
    seconds: float  # wall time of the whole run
    samples_per_s: float  # n_samples / seconds
    config: dict  # CalibrationConfig as a dict
    shape: dict | None = None  # adapter.Shape as a dict (ideal speedups of suggestions)
    fingerprint: str = ""  # sha256 of the prompt texts used (data.fingerprint)
    prompt_tokens: list[int] = dataclasses.field(default_factory=list)  # per sample
    response_tokens: list[int] = dataclasses.field(default_factory=list)  # per sample
    loss: list[float] = dataclasses.field(default_factory=list)  # per sample, summed CE
    loo_taylor: dict | None = None  # {"prefill": [L], "decode": [L]}: Taylor mean, LOO samples


@dataclass
class Batch:
    """[prompt ; response] sequences, right-padded."""

    ids: torch.Tensor  # (B, T) token ids, pad 0
    mask: torch.Tensor  # (B, T) 1 = real token
    stages: torch.Tensor  # (B, T) gates.stage_map codes
    prompt_lens: list[int]
    lengths: list[int]


def pack(prompts: list[list[int]], responses: list[list[int]], device=None) -> Batch:
    """Right-pad [prompt ; response] sequences into one batch."""
    seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)  # (B, T)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)  # (B, T)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(s)
        mask[b, :len(s)] = 1
    lens = [len(s) for s in seqs]
    plens = [len(p) for p in prompts]
    return Batch(ids.to(device), mask.to(device), stage_map(plens, lens, width), plens, lens)


def response_losses(lm: LoadedModel, batch: Batch) -> torch.Tensor:
    """Summed cross-entropy of each sample's response tokens under the current hooks: (B,)."""
    adapter = lm.adapter
    h = adapter.forward_padded(batch.ids, batch.mask)  # (B, T, D)
    # Positions that predict a response token (CPU indices; layers may sit on several devices).
    rows, cols = (batch.stages.cpu() == DECODE).nonzero(as_tuple=True)  # (M,), (M,)
    logits = adapter.head(h[rows.to(h.device), cols.to(h.device)])  # (M, V)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32, fp64 kept
    targets = batch.ids.cpu()[rows, cols + 1].to(logits.device)  # (M,)
    ce = torch.nn.functional.cross_entropy(logits, targets, reduction="none")  # (M,)
    out = torch.zeros(batch.ids.shape[0], device=ce.device, dtype=ce.dtype)  # (B,)
    return out.index_add(0, rows.to(ce.device), ce)  # (B,)


def gate_gradients(lm: LoadedModel, batch: Batch, influence: bool = True, tick=None) -> dict:
    """One forward + one backward: dL/dg per sample, layer and stage, plus block influence.

    Returns {"prefill": (B, L), "decode": (B, L), "loss": (B,), and when influence is on
    "bi_prefill": (B, L), "bi_decode": (B, L)}, on the CPU (float32; float64 for a float64 model).
    tick(message), when given, hears each layer of the forward and of the backward.
    """
    adapter = lm.adapter
    n, L = batch.ids.shape[0], adapter.n_layers
    dtype = torch.promote_types(lm.dtype, torch.float32)  # float32 gates; float64 model: float64
    gates = StageGates.ones(n, L, device=adapter.device, dtype=dtype)
    with frozen_weights(lm.model), torch.enable_grad():
        with gated(adapter, gates, batch.stages), maybe_block_influence(adapter, influence) as bi, \
                layer_ticks(adapter, tick or _silent):
            loss = response_losses(lm, batch)  # (B,)
            loss.sum().backward()  # per-sample gates only see their own sample's loss
    out = {"prefill": gates.prefill.grad.detach().cpu(), "decode": gates.decode.grad.detach().cpu(),
           "loss": loss.detach().cpu()}  # (B, L), (B, L), (B,)
    if influence:
        pairs = [stage_means(bi[i].cpu(), batch.stages) for i in range(L)]  # L x ((B,), (B,))
        out["bi_prefill"] = torch.stack([p for p, _ in pairs], dim=1)  # (B, L)
        out["bi_decode"] = torch.stack([d for _, d in pairs], dim=1)  # (B, L)
    return out


def _silent(message: str) -> None:
    pass


def _throttled(tracker: Tracker, every_s: float = 0.5):
    """A tick(message) that forwards to the tracker at most every `every_s` seconds."""
    last = [time.perf_counter()]

    def tick(message: str) -> None:
        now = time.perf_counter()
        if now - last[0] >= every_s:
            last[0] = now
            tracker.step(0, message)
    return tick


@torch.no_grad()
def leave_one_out(lm, prompt: list[int], response: list[int], rows_per_pass: int = 16) -> dict:
    """Exact loss increase when one layer's gate is 0 in one stage.

    Returns {"prefill": (L,), "decode": (L,)}.

    Row 0 is the full model, rows 1..L zero one prefill gate, rows L+1..2L one decode gate; the
    rows run as a batch of copies of the same sequence.
    """
    L = lm.adapter.n_layers
    single = pack([prompt], [response], lm.adapter.device)
    g = StageGates.ones(2 * L + 1, L, device=lm.adapter.device, requires_grad=False)
    idx = torch.arange(L)  # (L,)
    g.prefill[1 + idx, idx] = 0.0
    g.decode[1 + L + idx, idx] = 0.0
    losses = []
    for lo in range(0, 2 * L + 1, rows_per_pass):
        hi = min(lo + rows_per_pass, 2 * L + 1)
        part = StageGates(g.prefill[lo:hi], g.decode[lo:hi])
        rep = Batch(single.ids.expand(hi - lo, -1), single.mask.expand(hi - lo, -1),
                    single.stages.expand(hi - lo, -1), single.prompt_lens, single.lengths)
        with gated(lm.adapter, part, rep.stages):
            losses.append(response_losses(lm, rep).cpu())  # (R,)
    loss = torch.cat(losses)  # (2L+1,)
    return {"prefill": loss[1:L + 1] - loss[0], "decode": loss[L + 1:] - loss[0]}


def sample_seed(seed: int, index: int) -> int:
    """Sample i's own generator seed: results do not depend on how samples are batched."""
    return (seed * 1_000_003 + index) % (2 ** 63)


def sample_responses(lm: LoadedModel, prompts: list[list[int]], seeds: list[int],
                     cfg: CalibrationConfig, on_step=None) -> list[list[int]]:
    """Sample one response per prompt from the full model, as a left-padded batch with a cache.

    Row b draws with its own generator (seeds[b]) through generate.pick, so a row's tokens are those
    batch-1 sampling with that seed gives (up to float rounding of the padded batch).
    A response ends after an EOS token (kept) or max_new_tokens.
    """
    return sample_and_gradients(lm, prompts, seeds, cfg, listeners=Listeners(on_step=on_step))[0]


def encode_prompts(lm: LoadedModel, prompts: PromptSet, cfg: CalibrationConfig) -> list[list[int]]:
    if lm.tokenizer is None:
        raise ValueError(f"model {lm.name} has no tokenizer: calibrate it from token ids "
                         "(calibrate_ids)")
    return [encode(lm, text, raw=cfg.raw) for text in prompts.prompts[:cfg.n_samples]]


def calibrate(lm: LoadedModel, prompts: PromptSet, cfg: CalibrationConfig = CalibrationConfig(),
              progress=None) -> CalibrationResult:
    """Stage-aware importance of every layer over the first cfg.n_samples prompts of a set."""
    t0 = time.perf_counter()
    ids = encode_prompts(lm, prompts, cfg)
    return calibrate_ids(lm, ids, cfg, progress,
                         PromptOrigin(prompts.name, used_fingerprint(prompts, cfg)), t0=t0)


def used_fingerprint(prompts: PromptSet, cfg: CalibrationConfig) -> str:
    """Fingerprint of the prompts a run uses (the first n), however long the loaded set was."""
    return fingerprint(prompts.prompts[:cfg.n_samples])


def calibrate_ids(lm, prompt_ids: list[list[int]], cfg: CalibrationConfig = CalibrationConfig(),
                  progress=None, origin: PromptOrigin = PromptOrigin(),
                  t0: float | None = None) -> CalibrationResult:
    """calibrate() on prompts given as token ids (models without a tokenizer, tests)."""
    t0 = time.perf_counter() if t0 is None else t0
    prompt_ids = [list(p) for p in prompt_ids[:cfg.n_samples]]
    if not prompt_ids:
        raise ValueError("no prompts to calibrate on")
    for p in prompt_ids:
        check_prompt(lm.adapter, len(p), cfg.max_new_tokens)
    n = len(prompt_ids)
    n_loo = min(cfg.loo_samples, n)
    batches = _batches(lm, prompt_ids, cfg)
    plan = {"prefill": len(batches), "sampling": len(batches) * cfg.max_new_tokens,
            "gradients": n, "leave-one-out": n_loo}
    tracker = Tracker(n + n_loo, progress, "sampling responses", plan=plan)
    loo = None
    try:
        responses, grads = _taylor_pass(lm, prompt_ids, batches, cfg, tracker)
        if n_loo:
            loo = _loo_pass(lm, prompt_ids, responses, n_loo, 2 * cfg.batch_size, tracker)
    except Cancelled as c:  # keep the finished samples (all of them when LOO was running)
        done, responses, grads = c.partial or (list(range(n)), responses, grads)
        if not done:
            raise c.keep(None) from None
        finished = ([prompt_ids[i] for i in done], [responses[i] for i in done],
                    {k: v[done] for k, v in grads.items()})
        raise c.keep(_result(lm, origin, cfg, finished, None, time.perf_counter() - t0)) from None
    seconds = time.perf_counter() - t0
    return _result(lm, origin, cfg, (prompt_ids, responses, grads), loo, seconds)


def _taylor_pass(lm: LoadedModel, prompt_ids, batches: list[list[int]], cfg: CalibrationConfig,
                 tracker: Tracker):
    """Batches of similar prompt length: sampling and gradients in one pass each (fisher.py)."""
    n, L = len(prompt_ids), lm.adapter.n_layers
    responses: list[list[int]] = [[] for _ in range(n)]
    keys = ("prefill", "decode", "loss", "bi_prefill", "bi_decode")
    # float64 holds float32 gradients exactly and keeps a float64 model's
    grads = {k: torch.zeros((n, L) if k != "loss" else (n,), dtype=torch.float64) for k in keys}
    finished: list[int] = []
    try:
        for j, idx in enumerate(batches):
            head = f"batch {j + 1}/{len(batches)}"
            tick = _throttled(tracker)
            tracker.step(0, f"{head}: prefill")
            gates = StageGates.ones(len(idx), L, device=lm.adapter.device,
                                    dtype=torch.promote_types(lm.dtype, torch.float32))
            part, extra = sample_and_gradients(
                lm, [prompt_ids[i] for i in idx], [sample_seed(cfg.seed, i) for i in idx], cfg,
                gates, influence=True,
                listeners=Listeners(tick=lambda m: tick(f"{head}: {m}"),
                                    on_step=lambda step: _sampled(tracker, tick, step, head)))
            tracker.plan["sampling"] -= cfg.max_new_tokens - max(map(len, part))  # EOS came early
            g = {"prefill": gates.prefill.grad.detach().cpu(),
                 "decode": gates.decode.grad.detach().cpu(), **extra}
            for k in keys:
                grads[k][idx] = g[k].to(grads[k].dtype)
            for i, r in zip(idx, part):
                responses[i] = r
            finished += idx
            tracker.step(len(idx), f"{head} done", kind="gradients")
    except Cancelled as c:  # calibrate_ids builds a result from the finished samples
        raise c.keep((sorted(finished), responses, grads))
    return responses, grads


def _batches(lm: LoadedModel, prompt_ids, cfg: CalibrationConfig) -> list[list[int]]:
    """cfg.batch_size rows per batch, fewer where the CPU's memory would not hold the graph."""
    rows = cfg.batch_size
    if lm.adapter.device.type == "cpu":
        tokens = max(map(len, prompt_ids)) + cfg.max_new_tokens
        fit = rows_that_fit(lm.adapter.shape, tokens, available_bytes(),
                            torch.finfo(torch.promote_types(lm.dtype, torch.float32)).bits // 8)
        rows = min(rows, fit or rows)
    return plan_batches([len(p) for p in prompt_ids], rows)


def _sampled(tracker: Tracker, tick, step: int, head: str) -> None:
    """The prompt's pass (step -1) or one sampled token: a unit of the tracker's "prefill" or
    "sampling" work (checks for cancellation)."""
    tracker.step(0, kind="prefill" if step < 0 else "sampling", weight=1)
    tick(f"{head}: prompt read" if step < 0 else f"{head}: sampling token {step + 1}")


def _loo_pass(lm, prompt_ids, responses, n_loo: int, rows_per_pass: int, tracker: Tracker) -> dict:
    rows = []
    for i in range(n_loo):
        tracker.step(0, f"leave-one-out sample {i + 1}/{n_loo}")
        rows.append(leave_one_out(lm, prompt_ids[i], responses[i], rows_per_pass))
        tracker.step(1, kind="leave-one-out")
    return {k: torch.stack([r[k] for r in rows]) for k in ("prefill", "decode")}  # (K, L) each


def _result(lm, origin: PromptOrigin, cfg, samples: tuple, loo, seconds):
    """samples: the finished (prompt ids, responses, gradients by key); loo: (K, L) per stage
    for the first K of them, or None."""
    prompt_ids, responses, grads = samples
    sq_p = grads["prefill"].double() ** 2  # (n, L)
    sq_d = grads["decode"].double() ** 2  # (n, L)
    loo_out = corr = taylor = None
    if loo is not None:  # rank the same samples both ways
        n_loo = loo["prefill"].shape[0]
        loo_out = {k: loo[k].double().mean(0).tolist() for k in ("prefill", "decode")}
        taylor = {"prefill": sq_p[:n_loo].mean(0).tolist(), "decode": sq_d[:n_loo].mean(0).tolist()}
        corr = {k: spearman(taylor[k], loo_out[k]) for k in ("prefill", "decode")}
    n = len(prompt_ids)
    return CalibrationResult(
        model=lm.name, dataset=origin.dataset, n_samples=n, n_layers=lm.adapter.n_layers,
        prefill=sq_p.mean(0).tolist(), decode=sq_d.mean(0).tolist(),
        prefill_std=sq_p.std(0, correction=0).tolist(),
        decode_std=sq_d.std(0, correction=0).tolist(),
        prefill_samples=sq_p.tolist(), decode_samples=sq_d.tolist(),
        block_influence={"prefill": grads["bi_prefill"].double().mean(0).tolist(),
                         "decode": grads["bi_decode"].double().mean(0).tolist()},
        loo=loo_out, rank_corr=corr, seconds=seconds, samples_per_s=n / seconds if seconds else 0.0,
        config=dataclasses.asdict(cfg), shape=shape_record(lm.adapter.shape),
        fingerprint=origin.fingerprint, prompt_tokens=[len(p) for p in prompt_ids],
        response_tokens=[len(r) for r in responses], loss=grads["loss"].double().tolist(),
        loo_taylor=taylor)


# --- results store ---------------------------------------------------------------------------

def cache_params(lm: LoadedModel, prompts: PromptSet, cfg: CalibrationConfig) -> dict:
    """What determines a result: model, data, configuration (batch size only changes speed)."""
    card = lm.card()
    conf = dataclasses.asdict(cfg)
    conf.pop("batch_size")
    conf["n_samples"] = min(cfg.n_samples, len(prompts.prompts))
    return {"model": lm.name, "card": card, "dataset": prompts.name,
            "fingerprint": used_fingerprint(prompts, cfg), "n_samples": conf["n_samples"],
            "seed": cfg.seed, "config": conf}


def cached_calibration(lm: LoadedModel, prompts: PromptSet,
                       cfg: CalibrationConfig = CalibrationConfig(), use_cache: bool = True,
                       progress=None, notice=None) -> tuple[CalibrationResult, bool]:
    """(result, was_cache_hit); a miss (or an invalid entry) computes and stores the result.
    notice(line) hears about an ignored entry or a cache that cannot be written."""
    params = cache_params(lm, prompts, cfg)
    key = store.make_key(params)
    if use_cache:
        hit = load_calibration(key, lm.adapter.n_layers, notice,
                               expect={"model": lm.name, "n_samples": params["n_samples"]})
        if hit is not None:
            return hit, True
    result = calibrate(lm, prompts, cfg, progress)
    store.save_or_warn(KIND, key, result.to_dict(), params, notice)
    return result, False


def list_calibrations() -> list[dict]:
    """Stored calibrations, newest first: {key, saved_at, params}."""
    return store.entries(KIND)


def load_calibration(key: str, n_layers: int | None = None, notice=None,
                     expect: dict | None = None) -> CalibrationResult | None:
    """A stored result that passes records.check (per-layer lists of n_layers when given), or
    None when missing or invalid."""
    return store.load_record(KIND, key, CalibrationResult, n_layers, expect, notice)


def shape_record(shape) -> dict:
    """adapter.Shape as stored in a result (JSON types: the windows as a list)."""
    return {**dataclasses.asdict(shape), "windows": list(shape.windows)}
