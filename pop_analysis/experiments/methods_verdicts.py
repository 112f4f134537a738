"""Verdicts of the methods comparison, counted honestly: ties are ties, one cell per distinct k.

Rows (one per method, budget and shape, random draws apart) come from a comparison or from its
stored raw results. Budgets that give the same k on a model (Gemma-3-270M: 20% and 25% are both
4 layers) are one cell, named with every budget. When several methods pick the identical set,
the cell's best is all of them ("Gate Fisher, Gate Taylor and Tail pick the same set") and no
count credits one alone. A paired comparison of two sets over the same items is asked of
`paired(a, b)` -> (mean ΔNLL of a - b, 95% interval) or None (the same set, or not known).
"""
from __future__ import annotations

import statistics

from pop_analysis.importance.methods import METHODS

ORDER = list(METHODS)  # how tied methods are listed


def cells(rows: list[dict]) -> list[tuple[int, str, list[float]]]:
    """(k, shape, budgets) per distinct k and shape, in budget order."""
    out: dict[tuple[int, str], list[float]] = {}
    for r in sorted(rows, key=lambda r: (r["budget"], r["shape"])):
        bs = out.setdefault((r["k"], r["shape"]), [])
        if r["budget"] not in bs:
            bs.append(r["budget"])
    return [(k, shape, bs) for (k, shape), bs in out.items()]


def budgets_label(budgets) -> str:
    return " and ".join(f"{b:.0%}" for b in budgets)


def title_list(methods) -> str:
    names = [METHODS[m].title for m in sorted(methods, key=ORDER.index)]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def verdicts(rows: list[dict], paired) -> list[dict]:
    """One verdict per distinct (k, shape) cell (see the module doc)."""
    out = []
    for k, shape, budgets in cells(rows):
        group = [r for r in rows if r["k"] == k and r["shape"] == shape and r["budget"] == budgets[0]]
        out.append(verdict(group, budgets, paired))
    return out


def verdict(group: list[dict], budgets: list[float], paired) -> dict:
    methods = [r for r in group if r["method"] != "random"]
    top = min(methods, key=lambda r: r["continuation_nll_delta"])
    ties = sorted({r["method"] for r in methods if r["set"] == top["set"]}, key=ORDER.index)
    tail = next((r for r in methods if r["method"] == "tail"), None)
    randoms = sorted(r["continuation_nll_delta"] for r in group if r["method"] == "random")
    v = {"budget": budgets[0], "budgets": budgets, "shape": top["shape"], "k": top["k"],
         "best": ties[0], "best_methods": ties, "best_set": top["set"],
         "best_delta": top["continuation_nll_delta"],
         "best_delta_ci": top.get("continuation_nll_delta_ci"),
         "random": [randoms[0], statistics.median(randoms), randoms[-1]] if randoms else None}
    if tail is not None:
        v["tail_delta"], v["tail_delta_ci"] = tail["continuation_nll_delta"], \
            tail.get("continuation_nll_delta_ci")
        v["tail_beats"] = sorted({r["method"] for r in methods if r["set"] != tail["set"]
                                  and _clear(paired(tail["set"], r["set"]), below=True)},
                                 key=ORDER.index)
        if "tail" not in ties:
            d = paired(top["set"], tail["set"])
            if d is not None:
                v["vs_tail"], v["vs_tail_ci"] = d[0], list(d[1])
                v["separated"] = _clear(d, below=True) or _clear(d, below=False)
    v["line"] = verdict_line(v)
    return v


def _clear(d, below: bool) -> bool:
    """The paired interval lies wholly below 0 (below=True) or above it."""
    if d is None:
        return False
    lo, hi = d[1]
    return hi < 0 if below else lo > 0


def verdict_line(v: dict) -> str:
    """'20% and 25% (4 layers, free): best Gate Fisher and Gate Taylor (the same set: ...)'."""
    f = lambda x: f"{x:+.3f}"  # noqa: E731
    ci = v.get("best_delta_ci") or [v["best_delta"]] * 2
    ties = v["best_methods"]
    who = (f"best {title_list(ties)}" if len(ties) == 1
           else f"best {title_list(ties)}, which pick the same set")
    head = (f"{budgets_label(v['budgets'])} ({v['k']} layers, {v['shape']}): {who} "
            f"(layers {v['best_set']}, ΔNLL {f(v['best_delta'])} [{f(ci[0])}, {f(ci[1])}])")
    if "tail_delta" not in v:
        return head + "; no tail baseline in this run"
    if "tail" in ties:
        tail = ("; the tail's own set is best" if len(ties) == 1
                else "; the tail's set is among them: a tie, not a win")
    elif "vs_tail" in v:
        lo, hi = v["vs_tail_ci"]
        word = "separated from the tail" if v["separated"] else "not separated from the tail"
        tail = f"; vs tail {f(v['vs_tail'])} [{f(lo)}, {f(hi)}]: {word}"
    else:
        tail = "; vs tail: no paired comparison"
    beats = v.get("tail_beats") or []
    if beats:
        tail += f"; the tail beats {title_list(beats)}"
    return head + tail


def counts(verdicts_: list[dict]) -> dict:
    """Cells where the tail's set is best alone, where it ties, where another method's set is
    best, and where another beats it with a paired interval clear of 0."""
    out = {"cells": len(verdicts_), "tail_alone": [], "tail_tied": [], "other": [],
           "beats_tail": [], "tail_beats": {}}
    for v in verdicts_:
        cell = f"{budgets_label(v['budgets'])} {v['shape']}"
        ties = v["best_methods"]
        key = ("tail_alone" if ties == ["tail"] else "tail_tied" if "tail" in ties else "other")
        out[key].append(cell)
        if v.get("separated") and v.get("vs_tail", 0) < 0:
            out["beats_tail"].append((cell, v))
        for m in v.get("tail_beats") or []:
            out["tail_beats"][m] = out["tail_beats"].get(m, 0) + 1
    return out


def merged_budgets(verdicts_: list[dict]) -> list[str]:
    """'20% and 25% are both 4 layers' for every cell that merges budgets (once per k)."""
    seen, out = set(), []
    for v in verdicts_:
        if len(v["budgets"]) > 1 and v["k"] not in seen:
            seen.add(v["k"])
            out.append(f"{budgets_label(v['budgets'])} are both {v['k']} layers")
    return out
