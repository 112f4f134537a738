"""The order a class steps through a recorded step-through (stepthrough.StepThrough.steps), and
what each frame says; plain dicts in and out, no torch, so a page can draw a stored example before
the model has loaded."""
from __future__ import annotations

TITLES = {("full", "prefill"): "Full model: prefill (every layer, every prompt token)",
          ("pop", "prefill"): "POP: pruned prefill (skipped layers only project K/V)",
          ("pop", "boundary"): "POP: boundary step (x_N through the full model)"}

EXPLAIN = {
    ("full", "prefill"): "The full model reads the whole prompt: every layer runs attention and "
                         "FFN on every token, and writes K/V for every token into its cache.",
    ("pop", "prefill"): "POP reads x1..x(N-1) with the skipped layers pruned: they only project "
                        "K/V from the hidden state that reaches them (orange) and pass it on "
                        "unchanged, so their cache is complete. Layers below the first skipped "
                        "one see the same inputs as in the full model, so x_N rides along there.",
    ("pop", "boundary"): "The boundary step: the last prompt token x_N goes through the rest of "
                         "the model in full, attending to the whole cache. Its logits give the "
                         "first token: compare the two models' candidates below.",
    "decode": "Decode runs every layer on the new token, in both models; attention reads the "
              "complete cache (POP's prompt entries of the skipped layers came from the projection).",
    "heal": "Self-healing: the first token is already out. From the first skipped layer up, every "
            "layer runs again in full over these positions, from the exact hidden state below it "
            "and attending to the rows healed before, and its K/V replace the approximate rows "
            "(the cache grid: written now). Once every position is healed, the cache is the full "
            "model's for the same tokens, and decode reads exactly what the full model would.",
}


def frames(steps: list[dict]) -> list[dict]:
    """The sequence a class steps through: the full model's prefill, POP's pruned prefill, its
    boundary step, then each decode step (POP's grid; the full model runs the same layers),
    each after the healing pass that ran before it, when the POP run healed.
    Each frame: title, explain, the step it draws ("shown"), the step of the other run at the
    same point when there is one ("beside"), and the steps of the shown run before it."""
    by = {(s["run"], s["stage"]): s for s in steps}
    order = [("full", "prefill"), ("pop", "prefill")]
    order += [("pop", "boundary")] if ("pop", "boundary") in by else []
    j = 1
    while ("pop", f"decode {j}") in by:
        order += [("pop", f"heal {j}")] if ("pop", f"heal {j}") in by else []
        order.append(("pop", f"decode {j}"))
        j += 1
    out = []
    for run, stage in order:
        shown = by[(run, stage)]
        decode, heal = stage.startswith("decode"), stage.startswith("heal")
        beside = by.get(("full", stage)) if decode else \
            by.get(("full", "prefill")) if stage == "boundary" else None
        out.append({"title": TITLES.get((run, stage)) or (heal_title(shown) if heal else
                    f"Decode step {stage.split()[1]}: every layer, attention reads the whole cache"),
                    "explain": EXPLAIN["decode" if decode else "heal" if heal else (run, stage)],
                    "shown": shown, "beside": beside,
                    "earlier": [s for s in steps if s["run"] == run][:steps_before(steps, shown)]})
    return out


def heal_title(step: dict) -> str:
    """'Healing before decode step j: layers f-(L-1) re-run on positions a-b'."""
    layers = [i for i, pos in enumerate(step["attention"]) if pos]
    positions = sorted({p for pos in step["attention"] for p in pos})
    return (f"Healing before decode step {step['stage'].split()[1]}: layers {layers[0]}-{layers[-1]} "
            f"re-run on positions {positions[0] + 1}-{positions[-1] + 1}, their K/V rewritten")


def steps_before(steps: list[dict], step: dict) -> int:
    """How many steps its run took before `step`."""
    own = [s for s in steps if s["run"] == step["run"]]
    return next(i for i, s in enumerate(own) if s is step)


def position_tokens(steps: list[dict], run: str = "pop") -> list[str]:
    """The tokens at the generated positions of `run`: each is the token its previous step
    picked (the last pick has no position yet)."""
    return [s["token"][1] for s in steps if s["run"] == run and s["token"]][:-1]
