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
}


def frames(steps: list[dict]) -> list[dict]:
    """The sequence a class steps through: the full model's prefill, POP's pruned prefill, its
    boundary step, then each decode step (POP's grid; the full model runs the same layers).
    Each frame: title, explain, the step it draws ("shown"), the step of the other run at the
    same point when there is one ("beside"), and the steps of the shown run before it."""
    by = {(s["run"], s["stage"]): s for s in steps}
    order = [("full", "prefill"), ("pop", "prefill")]
    order += [("pop", "boundary")] if ("pop", "boundary") in by else []
    j = 1
    while ("pop", f"decode {j}") in by:
        order.append(("pop", f"decode {j}"))
        j += 1
    out = []
    for run, stage in order:
        shown = by[(run, stage)]
        decode = stage.startswith("decode")
        beside = by.get(("full", stage)) if decode else \
            by.get(("full", "prefill")) if stage == "boundary" else None
        out.append({"title": TITLES.get((run, stage)) or
                    f"Decode step {stage.split()[1]}: every layer, attention reads the whole cache",
                    "explain": EXPLAIN["decode" if decode else (run, stage)],
                    "shown": shown, "beside": beside,
                    "earlier": [s for s in steps if s["run"] == run][:steps_before(steps, shown)]})
    return out


def steps_before(steps: list[dict], step: dict) -> int:
    """How many steps its run took before `step`."""
    own = [s for s in steps if s["run"] == step["run"]]
    return next(i for i, s in enumerate(own) if s is step)


def position_tokens(steps: list[dict], run: str = "pop") -> list[str]:
    """The tokens at the generated positions of `run`: each is the token its previous step
    picked (the last pick has no position yet)."""
    return [s["token"][1] for s in steps if s["run"] == run and s["token"]][:-1]
