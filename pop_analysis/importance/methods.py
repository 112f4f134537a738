"""The importance methods POP Lab compares: names, what each measures, its cost, its series.

A method yields one or more per-layer series named "<method>.<series>" (the gate's prefill and
decode stages, the two sub-layers, drop-one's NLL and KL ...). Every series is oriented so that
larger = more important (a similarity enters as 1 - similarity), so any two rank layers the same
way round. Each method names its `primary` series: the one whose ranking picks its skip sets
(for POP, the prefill side where the method has stages).
"""
from __future__ import annotations

from dataclasses import dataclass

from pop_analysis.errors import InputError, shown


class MethodError(InputError):
    """An unknown method name, or a method list that names none."""


@dataclass(frozen=True)
class Method:
    """One way to rank layers."""

    name: str  # the name on the command line
    title: str  # the name on a chart
    family: str  # how it is computed: "gate" (calibration), "hooks" (the one forward), "dropone", "baseline"
    series: tuple[str, ...]  # its per-layer series, "<name>.<series>" in results
    primary: str  # the series its skip sets are picked from
    cost: str  # what it costs, in words
    teaching: str  # what it measures, one or two sentences
    source: str  # where it comes from


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("gate", "Gate Fisher", "gate", ("prefill", "decode"), "prefill",
           "1 forward + 1 backward per sample, on responses the model samples itself",
           "E[(dL/dg)²] of a virtual gate on the layer's residual branches, per stage: the loss "
           "increase a second-order expansion predicts when the layer is removed.",
           "POP (arXiv 2602.03295)"),
    Method("taylor", "Gate Taylor", "gate", ("prefill", "decode"), "prefill",
           "free with the gate's backward",
           "E[|g · dL/dg|]: the first-order Taylor estimate of the loss change from the same "
           "gradients, averaged in absolute value rather than squared.",
           "first-order Taylor pruning scores"),
    Method("bi", "Block Influence", "hooks", ("prefill", "decode"), "prefill",
           "1 forward with hooks (shared)",
           "1 - cos(layer input, layer output), averaged over prompt positions (prefill) or at "
           "the last prompt position (decode): how much the block turns the hidden state.",
           "ShortGPT (arXiv 2403.03853)"),
    Method("angular", "Angular distance", "hooks", ("last",), "last",
           "1 forward with hooks (shared)",
           "arccos(cos(h_l, h_l+n)) / π on the last prompt token: how far n blocks from l move "
           "the representation; the layer's score is n = 1, the full triangle shows spans.",
           "Gromov et al. (arXiv 2403.17887)"),
    Method("sublayer", "Sub-layer cosine", "hooks", ("attention", "mlp", "block"), "block",
           "1 forward with hooks (shared)",
           "1 - cos(input, output) of the attention and of the MLP sub-layer separately, over "
           "prompt positions; a block counts as much as its less redundant sub-layer (max).",
           "LLM-Drop (arXiv 2406.15786)"),
    Method("magnitude", "Relative magnitude", "hooks", ("prefill", "decode"), "prefill",
           "1 forward with hooks (shared)",
           "‖f(x)‖ / ‖x + f(x)‖: the size of what the block adds to the residual stream, "
           "relative to the stream after it.",
           "short-transformers; Prune&Comp (arXiv 2507.18212)"),
    Method("dropone", "Prefill-only drop-one", "dropone", ("nll", "kl"), "nll",
           "1 forward per layer from that layer up (the trunk below it is shared)",
           "Skip the layer POP-style for the prompt only (its K/V still projected) and score the "
           "full model's continuation: the NLL increase and KL(full ‖ pruned). POP's ground truth.",
           "POP's own ablation; cf. SLEB (arXiv 2402.09025)"),
    Method("tail", "Tail", "baseline", ("depth",), "depth",
           "zero",
           "No measurement: the deeper the layer, the less important, so a budget of k skips the "
           "last k layers.",
           "Reassessing layer pruning (arXiv 2411.15558)"),
    Method("random", "Random", "baseline", ("draw",), "draw",
           "zero",
           "Seeded random scores: what picking layers blindly gives; its spread over seeds is "
           "the noise floor any method must beat.",
           "baseline"),
)}
ALL = "all"


def parse_methods(text: str | None) -> tuple[str, ...]:
    """'gate,bi' -> ('gate', 'bi'); 'all' (or nothing) -> every method, in registry order."""
    if text is None or text.strip() == ALL:
        return tuple(METHODS)
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise MethodError(f"no method named in {shown(text)}; choose from {', '.join(METHODS)} or all")
    bad = [x for x in names if x not in METHODS]
    if bad:
        raise MethodError(f"unknown method {shown(bad[0])}; choose from {', '.join(METHODS)} or all")
    return tuple(dict.fromkeys(n for n in METHODS if n in names))


def primary(name: str) -> str:
    """The series key whose ranking picks `name`'s skip sets, e.g. 'gate.prefill'."""
    return f"{name}.{METHODS[name].primary}"


def series_keys(names) -> list[str]:
    """Every series key the methods yield, in registry order."""
    return [f"{n}.{s}" for n in names for s in METHODS[n].series]


def method_of(key: str) -> Method:
    return METHODS[key.split(".", 1)[0]]


def help_text() -> str:
    """One line per method for --help."""
    return "; ".join(f"{m.name} ({m.title}: {m.cost})" for m in METHODS.values())
