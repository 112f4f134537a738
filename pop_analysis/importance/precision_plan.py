"""The prompt-precision planner: per layer full / int8 / skip, fastest under a quality budget.

Predicted loss of a plan, from the stage-aware gate sensitivities (calibrate.py): the prefill
gate g_l scales both residual branches of layer l for the prompt positions, and the Fisher
approximation gives a loss increase of I_l (dg)^2 / 2 for a gate moved by dg. Skipping layer l is
dg = 1. Int8 perturbs the layer's branches by a relative error e_l (measured on calibration
prompts: |int8 branch - fp32 branch| / |fp32 branch| per token, RMS over tokens); the planner
prices it as a gate moved by e_l, I_l e_l^2 / 2. Losses add over layers (second order, no cross
terms), times add over layers (measured per layer, speed/precision_speed.layer_costs).

The plan minimises the summed time subject to the summed predicted loss <= budget: a dynamic
programme over layers on a grid of loss steps (exact up to that grid). Its pick is checked against
an exhaustive search over a configuration grid at equal measured quality (experiments/).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.pop import _embed, padding
from pop_analysis.engine.precision import PRECISIONS, Precision, twins
from pop_analysis.errors import InputError

STEPS = 2000  # loss grid of the dynamic programme (the budget in this many steps)


class PlanError(InputError):
    """A planning request that cannot be met; one line."""


@dataclass(frozen=True)
class Plan:
    """A planner's pick with what it predicts."""

    layers: tuple[str, ...]  # per layer: full / int8 / skip
    ms: float  # predicted prompt time, the sum of the layers' measured times
    loss: float  # predicted loss increase (nats, gate-sensitivity units)
    budget: float  # the budget it was planned under


def layer_losses(importance, int8_error) -> list[dict]:
    """Per layer {full: 0, int8: I e^2 / 2, skip: I / 2} from prefill importance and int8 error."""
    if len(importance) != len(int8_error):
        raise PlanError(f"{len(importance)} importances for {len(int8_error)} int8 errors")
    return [{"full": 0.0, "int8": i * e * e / 2, "skip": i / 2}
            for i, e in zip(importance, int8_error)]


def predicted_loss(plan, losses) -> float:
    return sum(losses[i][p] for i, p in enumerate(plan))


def predicted_ms(plan, costs) -> float:
    return sum(costs[i][p] for i, p in enumerate(plan))


def plan(costs, losses, budget: float, allowed=PRECISIONS) -> Plan:
    """The fastest per-layer plan with predicted loss <= budget. costs / losses: per layer
    {precision: ms} / {precision: loss}; `allowed` limits the choices (e.g. no skip)."""
    if not math.isfinite(budget) or budget < 0:
        raise PlanError(f"the quality budget must be a loss >= 0, got {budget!r}")
    if len(costs) != len(losses) or not costs:
        raise PlanError(f"costs for {len(costs)} layers, losses for {len(losses)}")
    unit = budget / STEPS if budget > 0 else math.inf  # a zero budget admits no loss at all
    # best[b] = (ms, choices) of layers so far with b loss steps used; b in 0..STEPS
    best: dict[int, tuple[float, tuple]] = {0: (0.0, ())}
    for c, q in zip(costs, losses):
        nxt: dict[int, tuple[float, tuple]] = {}
        for used, (ms, picks) in best.items():
            for p in allowed:
                steps = used + (math.ceil(q[p] / unit - 1e-9) if q[p] > 0 else 0)
                steps = steps if q[p] <= 0 or unit < math.inf else STEPS + 1
                if steps > STEPS:
                    continue
                cand = (ms + c[p], picks + (p,))
                if steps not in nxt or cand[0] < nxt[steps][0]:
                    nxt[steps] = cand
        best = nxt
    ms, picks = min(best.values())
    return Plan(picks, ms, predicted_loss(picks, losses), budget)


@torch.inference_mode()
def int8_errors(lm: LoadedModel, prompts) -> list[float]:
    """Per layer, the RMS over prompt tokens of |int8 layer update - fp32 layer update| /
    |fp32 layer update| (the update: the layer's output minus its input), on the full model's
    hidden states of each prompt (token-id lists)."""
    a = lm.adapter
    copies = twins(a, Precision(tuple(range(a.n_layers))))
    sums, count = [0.0] * a.n_layers, 0
    for ids in prompts:
        t = torch.tensor([list(ids)], device=a.device)  # (1, N)
        h, pos = _embed(a, t, 0, padding(None, 1, t.shape[1]))  # (1, N, D), (1, N)
        rope = a.rotary(h, pos)
        for i in range(a.n_layers):
            out = a.run_layer(i, h, pos, rope, a.new_cache())  # (1, N, D)
            q = a.run_layer(i, h, pos, rope, a.new_cache(), twin=copies[i])  # (1, N, D)
            ref = (out - h).norm(dim=-1).clamp_min(1e-12)  # (1, N)
            sums[i] += float((((q - out).norm(dim=-1) / ref) ** 2).sum())
            h = out
        count += t.shape[1]
    return [math.sqrt(s / count) for s in sums]
