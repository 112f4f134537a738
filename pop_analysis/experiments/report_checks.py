"""What of the paper's Tables 3 and 4 our measurements reproduce: one line per claim, each with
the paper's numbers, ours (with 95% intervals) and a verdict computed from the intervals."""
from __future__ import annotations

from scipy.stats import spearmanr

from pop_analysis.experiments.paper import PAPER_TABLES

COLLAPSE = 0.25  # an accuracy whose whole interval lies below this has collapsed
SMALL_LOSS = 0.10  # "loses little": the interval rules out a drop of more than 10 points


def _rows(res, key="variant") -> dict:
    return {r[key]: r for r in (res or {}).get("rows", [])}


def _acc(r) -> str:
    if not r or r.get("retrieval_acc") is None:
        return "not measured"
    lo, hi = r["retrieval_acc_ci"] or (None, None)
    ci = f" [{100 * lo:.1f}, {100 * hi:.1f}]" if lo is not None else ""
    return f"{100 * r['retrieval_acc']:.1f}%{ci}"


def _dnll(r) -> str:
    if not r or r.get("continuation_nll_delta") is None:
        return "not measured"
    ci = r.get("continuation_nll_delta_ci")
    return f"{r['continuation_nll_delta']:+.3f}" + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")


def _side(ci, threshold: float) -> bool | None:
    """True when the whole interval lies below `threshold`, False when wholly at or above it,
    None when it straddles (too few items to tell)."""
    if not ci:
        return None
    return True if ci[1] < threshold else False if ci[0] >= threshold else None


def _collapsed(r) -> bool | None:
    return _side(r and r.get("retrieval_acc_ci"), COLLAPSE)


def _below(a, b) -> bool | None:
    """a's accuracy interval lies wholly below b's (True), wholly at or above its low end
    (False), else undecided (None): a clear difference without a paired test."""
    if not a or not b or not a.get("retrieval_acc_ci") or not b.get("retrieval_acc_ci"):
        return None
    lo, hi = b["retrieval_acc_ci"]
    return True if a["retrieval_acc_ci"][1] < lo else False if a["retrieval_acc_ci"][0] >= hi else None


def _list(xs) -> str:
    return ", ".join(f"{x:g}" for x in xs) if xs else "none"


def _verdict(ok: bool | None) -> str:
    return {True: "**matches**", False: "**does not match**",
            None: "**inconclusive** (the intervals do not decide)"}[ok]


def ablation_findings(t3, t3r) -> list[str]:
    nll, acc = _rows(t3), _rows(t3r)
    if not nll:
        return []
    p = PAPER_TABLES["table3"]["rows"]
    pop, out = acc.get("pop"), []
    d = pop and pop.get("retrieval_acc_delta_ci")
    little = None if not d else True if d[0] >= -SMALL_LOSS else False if d[1] < -SMALL_LOSS else None
    out.append(f"POP costs little quality (paper GSM8K {p['full'][0]} -> {p['pop'][0]}, HotpotQA "
               f"{p['full'][1]} -> {p['pop'][1]}): ours retrieval {_acc(acc.get('full'))} -> "
               f"{_acc(pop)}, ΔNLL on GSM8K answers {_dnll(nll.get('pop'))}: {_verdict(little)} "
               f"(matches when the interval of the retrieval difference rules out a drop of more "
               f"than {100 * SMALL_LOSS:.0f} points).")
    pruned = [v for v in nll if v != "full" and nll[v].get("continuation_nll_delta") is not None]
    if "pop" in pruned:
        best = min(pruned, key=lambda v: nll[v]["continuation_nll_delta"])
        others = [v for v in pruned if v != "pop" and acc.get(v)]
        top = None if not acc else all((acc[v].get("retrieval_acc") or 0)
                                       <= (pop or {}).get("retrieval_acc", 0) for v in others)
        said = {True: "is the highest", False: "is not the highest", None: "not measured"}[top]
        ok = False if best != "pop" else top
        out.append(f"POP is the best of the pruned designs (paper: on both tasks): ours smallest "
                   f"ΔNLL is {best}'s, POP's retrieval {said}: {_verdict(ok)}.")
    for v, claim in (("shallow", "shallow pruning collapses"),
                     ("pop_no_kv", "without independent KV the model collapses"),
                     ("static", "removing the layers in decode too (stage-agnostic) collapses")):
        paper = (f"paper {p[v][0]} / {p[v][1]}" if v in p else
                 "paper: ShortGPT 25% on Llama-3.1-8B GSM8K 79.68 -> 0.38")
        out.append(f"{claim[0].upper() + claim[1:]} ({paper}): ours retrieval {_acc(acc.get(v))}, "
                   f"ΔNLL {_dnll(nll.get(v))}: {_verdict(_collapsed(acc.get(v)))}.")
    i, b = acc.get("interleaved"), acc.get("pop_no_boundary")
    out.append(f"Interleaved pruning keeps part of GSM8K but little long-context QA (paper "
               f"{p['interleaved'][0]} / {p['interleaved'][1]}): ours retrieval {_acc(i)}, ΔNLL "
               f"{_dnll(nll.get('interleaved'))}: {_verdict(_below(i, pop))} (matches when the "
               "intervals put its retrieval below POP's).")
    out.append(f"Without boundary handling GSM8K barely moves but long-context QA falls (paper "
               f"{p['pop_no_boundary'][0]} / {p['pop_no_boundary'][1]}): ours retrieval {_acc(b)}, "
               f"ΔNLL {_dnll(nll.get('pop_no_boundary'))}: {_verdict(_below(b, pop))} "
               "(matches when the intervals put its retrieval below POP's).")
    return out


def ratio_findings(t4, t4r) -> list[str]:
    rows = (t4 or {}).get("rows") or []
    if not rows:
        return []
    out = []
    acc = (t4r or {}).get("rows") or []
    held = [r["skip_ratio"] for r in acc if r.get("retrieval_acc_delta_ci")
            and r["retrieval_acc_delta_ci"][0] >= -SMALL_LOSS]
    lost = [r["skip_ratio"] for r in acc if r.get("retrieval_acc_delta_ci")
            and r["retrieval_acc_delta_ci"][1] < -SMALL_LOSS]
    if acc:
        third = [r for r in acc if abs(r["skip_ratio"] - 0.33) < 0.01]
        kept = _side(third[0].get("retrieval_acc_delta_ci"), -SMALL_LOSS) if third else None
        big = [r for r in acc if r["skip_ratio"] >= 0.6]
        fell = _side(big[0].get("retrieval_acc_delta_ci"), -SMALL_LOSS) if big else None
        shape = None if kept is None or fell is None else (kept is False and fell is True)
        out.append(f"Quality holds at a third and falls by 60% (paper HotpotQA 63.13 at 33%, "
                   f"34.69 at 50%, 5.45 at 60%): ours retrieval within {100 * SMALL_LOSS:.0f} "
                   f"points of the full model at ratios {_list(held)}, clearly more than that "
                   f"below at {_list(lost)}: {_verdict(shape)}.")
    nll = [(r["skip_ratio"], r["continuation_nll_delta"]) for r in rows
           if r.get("continuation_nll_delta") is not None]
    if len(nll) > 2:
        rho = spearmanr([r for r, _ in nll], [d for _, d in nll]).statistic
        out.append(f"The cost grows with the ratio: ours ΔNLL {', '.join(f'{d:+.3f}' for _, d in nll)} "
                   f"at ratios {', '.join(f'{r:g}' for r, _ in nll)} (Spearman rho {rho:.2f}): "
                   f"{_verdict(rho >= 0.8)}.")
    fr = [r["prefill_speedup"] / r["ideal_speedup"] for r in rows
          if r.get("ideal_speedup") and r["ideal_speedup"] > 1 and r.get("prefill_speedup")]
    if fr:
        ok = min(fr) >= 0.75 and max(fr) <= 1.0
        out.append(f"Measured prefill speedups are 75-95% of the ideal (paper, A100, 1024 tokens): "
                   f"ours {100 * min(fr):.0f}-{100 * max(fr):.0f}% of the FLOP ratio on this CPU: "
                   f"{_verdict(ok)}.")
    return out


def length_findings(res) -> list[str]:
    out = []
    for r in (res or {}).get("rows") or []:
        if not r.get("n") or r.get("full_retrieval_acc") is None:
            continue
        target = 0.9 if r["length"] <= 512 else 0.8
        full = {"retrieval_acc": r["full_retrieval_acc"],
                "retrieval_acc_ci": r.get("full_retrieval_acc_ci")}
        met = "met" if r["full_retrieval_acc"] >= target else "NOT met"
        out.append(f"The full model can do the retrieval task at {r['length']} tokens (target "
                   f">= {100 * target:.0f}%): {_acc(full)} (n = {r['n']}), POP {_acc(r)}: {met}.")
    return out


def findings(results: dict) -> list[str]:
    return (ablation_findings(results.get("table3"), results.get("table3_retrieval"))
            + ratio_findings(results.get("table4"), results.get("table4_retrieval"))
            + length_findings(results.get("length")))
