"""What stored results are made of: the Record mixin of result dataclasses, plain() (values
to JSON), and the row of a sweep, whose fields the record check reads."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


def plain(obj):
    """Dataclasses, tuples, numpy/torch scalars and arrays -> JSON-able values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return plain(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, float) and obj != obj:
        return None  # NaN is not JSON
    return obj


class Record:
    """Mixin for result dataclasses: a JSON-able dict out, and back in.

    from_dict ignores keys the class no longer has, so entries written by an older version load.
    """

    def to_dict(self) -> dict:
        return plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

@dataclass
class SweepRow(Record):
    variant: str  # sweep variant name (ABLATIONS key, or "adaptive")
    skip_ratio: float  # len(skip_layers) / L
    skip_layers: list[int]
    prefill_speedup: float  # median per-round TTFT(full) / TTFT(variant); 1.0 for the full model
    ideal_speedup: float  # the variant's FLOP ratio for this skip set at the timed length
    continuation_nll: float  # mean per-token NLL of the reference continuation (NaN: not measured)
    greedy_agreement: float  # mean token match rate with the full model's greedy output
    exact_match: float | None = None  # GSM8K exact match (task_accuracy)
    retrieval_acc: float | None = None  # synthetic retrieval exact match
    kind: str = ""  # which sweep made the row
    length: int | None = None  # prompt tokens of the timing (and of the items in a length sweep)
    n: int = 0  # items behind the quality numbers
    first_divergence: float | None = None  # mean first differing token over diverging items
    sequence_exact: float | None = None  # fraction of greedy outputs identical to the full model's
    teacher_forced_top1: float | None = None  # reference tokens that are the variant's argmax
    ttft_full_ms: float | None = None  # median TTFT of the full model (timed beside the variant)
    ttft_ms: float | None = None  # median TTFT of the variant
    engine_variant: str = ""  # the pop.py variant that ran
    item_tokens: int | None = None  # mean prompt tokens of the retrieval items (length sweep)
    full_continuation_nll: float | None = None  # the full model on the same items (length sweep)
    full_retrieval_acc: float | None = None  # the full model on the same items
    next_token_kl: float | None = None  # mean over items of the per-token KL(full || variant), nats
    next_token_top1: float | None = None  # continuation tokens where the argmax is the full model's
    # Speed as the timing protocol measured it (defaults: a row stored before the protocol).
    speedup_range: list[float] | None = None  # [q1, q3] of the per-round ratios
    timing_rounds: int = 0  # timed rounds (0: not timed)
    timing_trustworthy: bool = False  # no noise flag raised
    timing_note: str | None = "timed before the timing protocol: re-run the sweep"  # why not
    roofline_speedup: float | None = None  # roofline ideal (FLOPs and bytes, this machine)
    intervals: dict = field(default_factory=dict)  # M_ci, M_delta, M_delta_ci ... (flattened)

    def to_dict(self) -> dict:
        """The row with its interval fields flattened in (the CLI / CSV contract)."""
        d = super().to_dict()
        return {**d, **d.pop("intervals")}
