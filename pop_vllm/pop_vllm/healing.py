"""Self-healing POP's settings (pure: no torch, no vLLM): which policy heals a pruned prompt's
cache after the first token, in chunks of how many positions, under which per-step budget.

Policies:
    none    today's POP: the skipped layers' prompt K/V stay approximate for the whole request
    eager   every position is healed at once, between the first token and the second
    budget  at most `budget_positions` positions, or about `budget_ms` milliseconds, of healing
            before each decode step, until the cache is the full model's

One validator (`make`) checks every field; a refusal is one line naming the field and the rule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import SettingError

POLICIES = ("none", "eager", "budget")
DEFAULT_CHUNK = 64  # positions per healing chunk: one pass of layers f..L-1 over that many rows
MAX_CHUNK = 65536  # bounded before it is expanded: no context holds more
MIN_STEP_POSITIONS = 2  # each decode step adds one position to heal, so a step must heal two
MAX_BUDGET_MS = 60_000.0
# Variants whose prompt K/V healing can make exact: the cache holds a row for every position.
HEALABLE = ("pop", "pop_repair")
# Variants with nothing to heal: the cache is the full model's from the start.
NOTHING_TO_HEAL = ("full",)


class HealError(SettingError):
    """Healing options no run can use; the message is one line."""


@dataclass(frozen=True)
class Heal:
    """How a request heals its pruned prompt (validated by `make`; build it through `make`)."""

    policy: str = "none"
    chunk: int = DEFAULT_CHUNK
    budget_positions: int | None = None  # budget: positions healed before each decode step
    budget_ms: float | None = None  # budget: milliseconds of healing before each decode step

    def __post_init__(self):
        check(self)

    @property
    def active(self) -> bool:
        return self.policy != "none"

    def as_dict(self) -> dict:
        return {"policy": self.policy, "chunk": self.chunk,
                "budget_positions": self.budget_positions, "budget_ms": self.budget_ms}


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check(heal: Heal) -> None:
    """The one validator of a Heal's fields (one line per refusal)."""
    if heal.policy not in POLICIES:
        raise HealError(f"unknown heal policy {heal.policy!r:.60}; choose from {', '.join(POLICIES)}")
    if not _is_int(heal.chunk) or not 1 <= heal.chunk <= MAX_CHUNK:
        raise HealError(f"heal chunk must be an integer in 1..{MAX_CHUNK} positions, "
                        f"got {heal.chunk!r:.60}")
    given = [n for n in ("budget_positions", "budget_ms") if getattr(heal, n) is not None]
    if heal.policy != "budget":
        if given:
            raise HealError(f"{given[0]} applies to heal policy budget only, not {heal.policy}")
        return
    if len(given) != 1:
        raise HealError("heal policy budget needs exactly one of budget_positions (positions per "
                        "decode step) and budget_ms (milliseconds per decode step)")
    if heal.budget_positions is not None:
        c = heal.budget_positions
        if not _is_int(c) or not MIN_STEP_POSITIONS <= c <= MAX_CHUNK:
            raise HealError(f"budget_positions must be an integer in {MIN_STEP_POSITIONS}..{MAX_CHUNK} "
                            "(each decode step adds a position to heal, so fewer than 2 never "
                            f"catch up), got {c!r:.60}")
        return
    ms = heal.budget_ms
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) \
            or not 0 < ms <= MAX_BUDGET_MS:
        raise HealError(f"budget_ms must be a number in (0, {MAX_BUDGET_MS:g}] milliseconds, "
                        f"got {ms!r:.60}")


NO_HEAL = Heal()


def make(policy: str = "none", chunk=DEFAULT_CHUNK, budget_positions=None, budget_ms=None) -> Heal:
    """A checked Heal (raises HealError with one line)."""
    return Heal(policy, chunk, budget_positions, budget_ms)


def from_dict(raw: dict) -> Heal:
    """`Heal.as_dict`'s fields (a request, a stored record) -> a checked Heal; {} is none."""
    unknown = sorted(set(map(str, raw)) - {"policy", "chunk", "budget_positions", "budget_ms"})
    if unknown:
        raise HealError(f"unknown heal field(s) {', '.join(unknown)[:120]}; use policy, chunk, "
                        "budget_positions and budget_ms")
    return make(**raw)


def parse_budget(text: str) -> dict:
    """A budget as written on a command line: '16' or '16pos' positions, '5ms' milliseconds."""
    raw = str(text).strip().lower()
    try:
        if raw.endswith("ms"):
            return {"budget_ms": float(raw[:-2])}
        return {"budget_positions": int(raw[:-3] if raw.endswith("pos") else raw)}
    except ValueError:
        raise HealError(f"heal budget must read like 16 (positions per step) or 5ms, got "
                        f"{text!r:.60}") from None


def check_variant(heal: Heal, variant: str) -> None:
    """Healing needs a cache row at every prompt position and the full model in decode."""
    if heal.active and variant not in HEALABLE + NOTHING_TO_HEAL:
        raise HealError(f"healing applies to variants {', '.join(HEALABLE)} (full has nothing to "
                        f"heal), not {variant}")
