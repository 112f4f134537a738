"""Closed-form repair of the skipped layers' K/V (beyond the paper; docs/repair.md).

Under POP every layer l of a contiguous skipped block S = {f..g} projects its prompt K/V from the
hidden state x_f that reaches the block, while the full model projects them from its own input x_l.
The repair fits, per layer and separately for K and V, a linear map (with intercept) from
LN_l(x_f) to the full model's true projections k_proj(LN_l(x_l)) and v_proj(LN_l(x_l)), taken
before k_norm and RoPE (both act after the projection and stay as they are).

Features are LN_l(x_f): layer l's own input norm applied to x_f, its gain included. So at run time
the layer's norm feeds the fitted map exactly where it fed k_proj / v_proj: same matmul shapes,
same prefill cost, nothing else changes (the gain is folded into the map by construction).
The fit is scikit-learn's RidgeCV (efficient leave-one-out cross-validation over a grid of ridge
strengths relative to the features' mean energy), one fit per layer and per K / V.

Calibration positions whose token prefix several sequences share (the chat template's system
prompt) give identical rows: each is kept once with a weight = the number of sequences sharing it.
Weighted, the fit sees the data as it is (every prompt carries that prefix, attention sinks
included); kept once, leave-one-out validation never sees a left-out row's own copy (which would
pick too weak a ridge). Fitting the rows unweighted (`weighted=False`) closes far less of the
POP-vs-full gap on held-out data (docs/repair.md).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from pop_analysis.engine.adapter import DecoderAdapter
from pop_analysis.engine.checkpoint import kv_weights
from pop_analysis.engine.hooks import Hooks
from pop_analysis.engine.pop import RepairError, left_pad, prefill
from pop_analysis.engine.skipset import describe
from pop_analysis.progress import Tracker

if TYPE_CHECKING:
    from pop_analysis.engine.models import LoadedModel

ALPHA_GRID = tuple(float(10.0 ** (e / 2)) for e in range(-12, 5))  # 1e-6 .. 1e2, half decades
MIN_TOKENS_PER_FEATURE = 2  # distinct calibration tokens needed per input feature (and intercept)


@dataclass(frozen=True)
class RepairConfig:
    """What a repair is fitted on; hashed (with the model and skip set) for its store key."""

    data: str = "builtin"  # builtin, a prompt file or hf:NAME; with `answers`: also gsm8k_train
    field: str | None = None  # prompt field of a file (default: detected)
    n_samples: int = 64  # calibration prompts (records)
    answers: bool = False  # append each record's reference answer as the assistant's turn
    raw: bool = False  # tokenise without the chat template
    max_tokens: int = 32768  # distinct calibration tokens used at most (the first ones)
    alphas: tuple[float, ...] = ALPHA_GRID  # ridge strengths, times the features' mean energy
    weighted: bool = True  # weight each distinct row by the sequences sharing its prefix


@dataclass
class Calibration:
    """Token sequences to fit on, and what they are."""

    sequences: list[list[int]]  # token ids per record
    name: str  # data set name
    fingerprint: str  # sha256 of the texts (or items)


@dataclass
class Activations:
    """What the full model computes on the calibration tokens (distinct positions only)."""

    x: torch.Tensor  # (T, D) hidden state entering the first skipped layer, float32 on the host
    weight: torch.Tensor  # (T,) calibration sequences sharing each row's token prefix
    k: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (T, Hkv*Dh) k_proj out
    v: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (T, Hkv*Dh) v_proj out

    @property
    def n_tokens(self) -> int:
        return self.x.shape[0]


@dataclass
class LayerFit:
    """One fitted map and how well it predicts (R^2 pools every output dimension)."""

    weight: torch.Tensor  # (out, D), as the layer's own projection weight
    bias: torch.Tensor  # (out,)
    alpha: float  # chosen ridge strength (absolute)
    r2_loo: float  # leave-one-out R^2 of the fitted map on the calibration tokens
    r2_pop: float  # R^2 of plain POP's projection (original weights on LN_l(x_f)), same tokens


class RepairDataError(RepairError):
    """Calibration data that cannot fit a repair (too few tokens, no answers)."""


def check_block(skip, n_layers: int) -> tuple[int, ...]:
    """The skip set as a sorted contiguous block; a one-line error otherwise."""
    skip = tuple(sorted(int(i) for i in skip))
    if not skip:
        raise RepairError("nothing to repair: the skip set is empty")
    if skip != tuple(range(skip[0], skip[-1] + 1)) or skip[-1] >= n_layers:
        raise RepairError(f"a repair needs one contiguous block of layers within 0..{n_layers - 1}"
                          f" (every skipped layer then sees the same x_f), got {describe(skip)}")
    return skip


def min_tokens(hidden: int) -> int:
    """Distinct calibration tokens needed to fit maps from `hidden` features (plus intercept)."""
    return MIN_TOKENS_PER_FEATURE * (hidden + 1)


def check_tokens(n_tokens: int, hidden: int) -> None:
    need = min_tokens(hidden)
    if n_tokens < need:
        raise RepairDataError(f"too few calibration tokens: {n_tokens} distinct, fitting "
                              f"{hidden} features needs at least {need}; add prompts or append "
                              "answers")


# --- calibration data ---------------------------------------------------------------------------

def check_data(cfg: RepairConfig) -> None:
    """Before any model loads: the calibration data holds cfg.n_samples items (one line saying
    how many it holds, if not)."""
    if cfg.answers:
        from pop_analysis.quality.evalsets import check_size

        check_size(cfg.data, cfg.n_samples)
    else:
        from pop_analysis.data.prompts import load_prompts

        load_prompts(cfg.data, field=cfg.field, limit=cfg.n_samples)


def calibration(lm: LoadedModel, cfg: RepairConfig) -> Calibration:
    """Token sequences of the calibration set: prompts through the chat template (as evaluation
    feeds them), followed by the reference answer when `cfg.answers`."""
    from pop_analysis.engine.generate import encode

    if cfg.answers:
        from pop_analysis.quality.evalsets import load_eval_set

        items = load_eval_set(lm, cfg.data, cfg.n_samples, raw=cfg.raw)
        if not any(it.reference_ids for it in items.items):
            raise RepairDataError(f"{cfg.data}: no reference answers to append (fields answer, "
                                  "response, output, completion or target); drop --answers")
        seqs = [list(it.prompt_ids) + list(it.reference_ids) for it in items.items]
        return Calibration(seqs, items.name, items.fingerprint)
    from pop_analysis.data.prompts import load_prompts

    prompts = load_prompts(cfg.data, field=cfg.field, limit=cfg.n_samples)
    return Calibration([encode(lm, p, raw=cfg.raw) for p in prompts.prompts], prompts.name,
                       prompts.fingerprint)


def distinct_positions(sequences) -> tuple[list[int], list[list[int]]]:
    """Per sequence, the first position whose token prefix no earlier sequence shares, and the
    multiplicity of each position from there on: how many sequences share its whole prefix."""
    nodes: dict[tuple[int, int], int] = {}  # (parent node, token) -> node of a prefix trie
    paths, counts = [], []
    for seq in sequences:
        node, path = -1, []
        for tok in seq:
            node = nodes.setdefault((node, int(tok)), len(nodes))
            path.append(node)
        paths.append(path)
    for path in paths:
        for node in path:
            counts.extend([0] * (node + 1 - len(counts)))
            counts[node] += 1
    starts, weights, seen = [], [], set()
    for path in paths:
        start = next((t for t, node in enumerate(path) if node not in seen), len(path))
        seen.update(path)
        starts.append(start)
        weights.append([counts[node] for node in path[start:]])
    return starts, weights


# --- collection ---------------------------------------------------------------------------------

class _Recorder:
    """Hook targets: per row of the batch, the columns from `first[row]` on, per quantity."""

    def __init__(self):
        self.first: list[int] = []  # per batch row: first column to keep
        self.rows: dict[str, list[torch.Tensor]] = {"w": []}

    def keep(self, name: str, t: torch.Tensor) -> None:  # t: (B, T, F)
        t = t.detach().float().cpu()
        self.rows.setdefault(name, []).extend(t[b, c:] for b, c in enumerate(self.first))

    def on_norm_input(self, _module, args):
        self.keep("x", args[0])  # (B, T, D): the hidden state entering the first skipped layer

    def on_proj(self, name, _module, _args, out):
        self.keep(name, out)  # (B, T, Hkv*Dh)


def _budget(sequences, max_tokens: int) -> list[tuple[list[int], int, list[int]]]:
    """(tokens, first distinct position, row weights) per sequence that adds distinct tokens,
    cut so that at most max_tokens distinct positions are kept in all."""
    out, total = [], 0
    for seq, start, w in zip(sequences, *distinct_positions(sequences)):
        n = min(len(seq) - start, max_tokens - total)
        if n > 0:
            out.append((list(seq[: start + n]), start, w[:n]))
            total += n
    return out


@torch.inference_mode()
def collect(lm: LoadedModel, sequences, skip, max_tokens: int = 32768, progress=None,
            batch_size: int = 16) -> Activations:
    """Run the full model over the sequences (left-padded batches of similar length) and record
    x_f and every skipped layer's true (pre-k_norm, pre-RoPE) K and V at the distinct positions,
    up to `max_tokens` of them."""
    adapter: DecoderAdapter = lm.adapter
    skip = check_block(skip, adapter.n_layers)
    work = sorted(_budget(sequences, max_tokens), key=lambda r: len(r[0]))
    tracker = Tracker(len(work), progress, "collecting activations")
    rec = _Recorder()
    with Hooks() as hooks:
        hooks.before(adapter.input_norm(skip[0]), rec.on_norm_input)
        for i in skip:
            hooks.after(adapter.k_proj(i), partial(rec.on_proj, f"k{i}"))
            hooks.after(adapter.v_proj(i), partial(rec.on_proj, f"v{i}"))
        for b in range(0, len(work), batch_size):
            chunk = work[b: b + batch_size]
            ids, mask = left_pad([seq for seq, _, _ in chunk], device=adapter.device)  # (B, T)
            rec.first = [ids.shape[1] - len(seq) + start for seq, start, _ in chunk]
            prefill(adapter, ids, adapter.new_cache(), attention_mask=mask)  # the full model
            rec.rows["w"].extend(torch.tensor(w, dtype=torch.float) for _, _, w in chunk)
            tracker.step(len(chunk), f"{sum(len(w) for w in rec.rows['w'])} tokens")
    if not rec.rows["w"]:
        raise RepairDataError("the calibration set gave no tokens")
    cat = {name: torch.cat(rows) for name, rows in rec.rows.items()}  # (T, F) each, w (T,)
    return Activations(cat["x"], cat["w"], {i: cat[f"k{i}"] for i in skip},
                       {i: cat[f"v{i}"] for i in skip})


# --- fitting ------------------------------------------------------------------------------------

def features(adapter: DecoderAdapter, i: int, x: torch.Tensor) -> np.ndarray:
    """LN_i(x_f): layer i's input norm (gain included) on the recorded x_f, float64 (T, D)."""
    norm = adapter.input_norm(i)
    with torch.inference_mode():
        out = norm(x.to(norm.weight.device, norm.weight.dtype))  # (T, D)
    return out.double().cpu().numpy()


def fit_map(x: np.ndarray, y: np.ndarray, alphas, original=None, weight=None) -> LayerFit:
    """RidgeCV from features x (T, D) to targets y (T, out), rows weighted by `weight` (T,);
    `original` (weight, bias) scores plain POP's projection on the same tokens."""
    from sklearn.linear_model import RidgeCV

    w = np.ones(x.shape[0]) if weight is None else np.asarray(weight, dtype=np.float64)  # (T,)
    xc = x - np.average(x, axis=0, weights=w)  # (T, D)
    energy = float((w[:, None] * xc * xc).sum()) / x.shape[1]  # mean eigenvalue of xc^T W xc
    grid = [a * max(energy, 1e-12) for a in alphas]
    model = RidgeCV(alphas=grid, fit_intercept=True).fit(x, y, sample_weight=w)
    # sklearn's leave-one-out score is -mean(w * squared error): R^2 against the same scale.
    total = float((w[:, None] * (y - np.average(y, axis=0, weights=w)) ** 2).mean())
    r2_pop = float("nan")
    if original is not None:
        wt, b = (t.double().numpy() for t in original)
        r2_pop = 1.0 - float((w[:, None] * (x @ wt.T + b - y) ** 2).mean()) / total
    return LayerFit(torch.from_numpy(np.ascontiguousarray(model.coef_)).float(),
                    torch.from_numpy(np.atleast_1d(model.intercept_)).float(), float(model.alpha_),
                    1.0 + float(model.best_score_) / total, r2_pop)


def fit(lm: LoadedModel, acts: Activations, skip, alphas=ALPHA_GRID, progress=None,
        weighted: bool = True) -> dict:
    """Fitted maps for every skipped layer: {layer: {"k": LayerFit, "v": LayerFit}}; rows are
    weighted by how many calibration sequences share them unless `weighted` is False."""
    adapter: DecoderAdapter = lm.adapter
    skip = check_block(skip, adapter.n_layers)
    check_tokens(acts.n_tokens, acts.x.shape[1])
    tracker = Tracker(2 * len(skip), progress, "fitting")
    weight = acts.weight.double().numpy() if weighted else None  # (T,)
    out = {}
    for i in skip:
        x = features(adapter, i, acts.x)  # (T, D)
        out[i] = {}
        for name, target, proj in (("k", acts.k[i], adapter.k_proj(i)),
                                   ("v", acts.v[i], adapter.v_proj(i))):
            bias = proj.bias if proj.bias is not None else torch.zeros(proj.weight.shape[0])
            original = (proj.weight.detach().float().cpu(), bias.detach().float().cpu())
            if i == skip[0]:  # the first skipped layer's input is x_f: its own map is exact
                out[i][name] = LayerFit(*original, float("nan"), 1.0, 1.0)
            else:
                out[i][name] = fit_map(x, target.double().numpy(), alphas, original, weight)
            tracker.step(message=f"layer {i} {name.upper()}")
    return out

@dataclass
class Repair:
    """Fitted K/V maps of one contiguous skip set of one model."""

    key: str  # store key ("" until saved)
    skip: tuple[int, ...]  # the skip set the maps were fitted for
    model: dict  # model_identity() of the model they were fitted on
    config: RepairConfig  # what they were fitted on
    tensors: dict  # "L.k.weight" (out, D), "L.k.bias" (out,), "L.v.weight", "L.v.bias" per layer
    info: dict  # data, token count, per-layer alpha and R^2, timings

    def maps(self) -> dict:
        """layer -> (k weight, k bias, v weight, v bias), as adapter.register_kv_maps takes."""
        t = self.tensors
        return {i: tuple(t[f"{i}.{n}.{p}"] for n in "kv" for p in ("weight", "bias"))
                for i in self.skip}

    def nbytes(self, dtype: torch.dtype = torch.float32) -> int:
        """Memory of the extra projections held in `dtype`."""
        size = torch.empty((), dtype=dtype).element_size()
        return sum(t.numel() for t in self.tensors.values()) * size


def model_identity(lm: LoadedModel) -> dict:
    """What a repair must match: shape, and a fingerprint of the first and last layers' K/V
    weights rounded to bfloat16 (so float32 and bfloat16 loads of one checkpoint agree)."""
    a = lm.adapter
    weights = [p.weight for i in (0, a.n_layers - 1) for p in (a.k_proj(i), a.v_proj(i))]
    s = a.shape
    return {"name": lm.name, "fingerprint": fingerprint(weights), "layers": s.n_layers,
            "hidden": s.hidden, "kv_dim": s.n_kv_heads * s.head_dim}


def fingerprint(weights) -> str:
    """The identity hash of [k_0, v_0, k_last, v_last] projection weights."""
    h = hashlib.sha256()
    for w in weights:
        h.update(w.detach().to("cpu", torch.bfloat16).view(torch.int16).numpy().tobytes())
    return h.hexdigest()[:16]


def checkpoint_fingerprint(directory, n_layers: int) -> str:
    """`model_identity`'s fingerprint read from a saved checkpoint, no model built (serving)."""
    return fingerprint(kv_weights(directory, (0, n_layers - 1)))


def fit_repair(lm: LoadedModel, skip, cfg: RepairConfig = RepairConfig(), progress=None,
               data: Calibration | None = None):
    """Calibration data -> activations -> fitted maps, as a Repair (not yet stored or attached).
    `data` is calibration(lm, cfg) when the caller already has it."""
    t0 = time.perf_counter()
    skip = check_block(skip, lm.adapter.n_layers)
    data = data or calibration(lm, cfg)
    starts = distinct_positions(data.sequences)[0]  # refuse too little data before any forward
    distinct = sum(max(len(q) - s, 0) for q, s in zip(data.sequences, starts))
    check_tokens(min(distinct, cfg.max_tokens), lm.adapter.shape.hidden)
    acts = collect(lm, data.sequences, skip, cfg.max_tokens, progress)
    t_collect = time.perf_counter() - t0
    fits = fit(lm, acts, skip, cfg.alphas, progress, cfg.weighted)
    stats = {str(i): {f"{n}_{s}": getattr(f, s) for n, f in layer.items()
                      for s in ("alpha", "r2_loo", "r2_pop")} for i, layer in fits.items()}
    info = {"data": {"name": data.name, "fingerprint": data.fingerprint,
                     "sequences": len(data.sequences)},
            "n_tokens": acts.n_tokens, "fit": stats, "collect_s": t_collect,
            "seconds": time.perf_counter() - t0, "threads": torch.get_num_threads()}
    tensors = {f"{i}.{n}.{p}": getattr(f, p).contiguous() for i, layer in fits.items()
               for n, f in layer.items() for p in ("weight", "bias")}
    return Repair(key="", skip=skip, model=model_identity(lm), config=cfg, tensors=tensors,
                  info=info)
