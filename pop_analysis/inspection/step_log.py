"""Which layer computed which positions, stage by stage, read from forward hooks on the model's
own modules while the engine runs (nothing here re-states what POP should do).

The engine runs the stack chunk by chunk (`pop.run_layers`); each chunk starts with one call of the
rotary embedding carrying the chunk's position ids, so a hook there names the positions every
later call of that chunk works on. Attention and FFN calls of layer i are hooked on their modules
(the engine's counters, engine.counters, count the matmuls instead: the tests hold the two
witnesses equal); a K projection outside its layer's attention is POP's
independent K/V projection of a skipped layer. The stage comes from the CallCounts object the
engine updates between phases ("prefill", "boundary"; the caller names decode steps), so the
log and the engine's own counters describe the same run.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import partial

from pop_analysis.engine.adapter import DecoderAdapter
from pop_analysis.engine.hooks import Hooks

PARTS = ("attention", "ffn", "kv", "int8")  # kv: the K/V projection alone (h passes the layer
# unchanged); int8: the layer's int8 copy (attention + FFN) ran instead of the fp32 layer


class PositionLog:
    """events: (stage, part, layer, positions) in the order they ran."""

    def __init__(self, counts):
        self.counts = counts  # engine.counters.CallCounts: .stage is set by the engine
        self.positions: list[int] = []  # the chunk the stack is running now
        self.in_attention: set[int] = set()  # layers whose attention call is under way
        self.events: list[tuple[str, str, int, list[int]]] = []

    def on_rope(self, _module, args, kwargs) -> None:
        pos = kwargs.get("position_ids", args[1] if len(args) > 1 else None)  # (B, T)
        self.positions = [int(p) for p in pos[0].tolist()]

    def on_attention_start(self, i: int) -> None:
        self.in_attention.add(i)

    def on_part(self, part: str, i: int) -> None:
        if part == "attention":
            self.in_attention.discard(i)
        elif part == "kv" and i in self.in_attention:
            return  # the K projection inside a full layer's attention
        self.events.append((self.counts.stage, part, i, list(self.positions)))

    def stages(self) -> list[str]:
        """Stages in the order they first ran."""
        seen: list[str] = []
        for stage, *_ in self.events:
            if stage not in seen:
                seen.append(stage)
        return seen

    def grid(self, stage: str, n_layers: int) -> dict[str, list[list[int]]]:
        """{part: per layer, the positions that part ran on in `stage`} (sorted, no repeats)."""
        out = {part: [set() for _ in range(n_layers)] for part in PARTS}
        for s, part, i, pos in self.events:
            if s == stage:
                out[part][i].update(pos)
        return {part: [sorted(p) for p in per_layer] for part, per_layer in out.items()}


def _start(log: PositionLog, i: int, *_) -> None:
    log.on_attention_start(i)


def _part(log: PositionLog, part: str, i: int, *_) -> None:
    log.on_part(part, i)


@contextmanager
def log_positions(adapter: DecoderAdapter, counts, twins=None):
    """Record what each layer runs on which positions while the block runs; `counts` is the
    CallCounts the engine is told the stage through (engine.counters.count_calls). `twins`
    {layer: int8 copy} are hooked too: their calls are logged as the part "int8"."""
    log = PositionLog(counts)
    with Hooks() as hooks:
        hooks.before(adapter.rotary_module(), log.on_rope, with_kwargs=True)
        for i in range(adapter.n_layers):
            hooks.before(adapter.attention(i), partial(_start, log, i))
            hooks.after(adapter.attention(i), partial(_part, log, "attention", i))
            hooks.after(adapter.ffn(i), partial(_part, log, "ffn", i))
            for m in (adapter.k_proj(i), *adapter.kv_map_modules(i)):
                hooks.after(m, partial(_part, log, "kv", i))
        for i, twin in (twins or {}).items():
            hooks.after(twin.self_attn, partial(_part, log, "int8", i))
        yield log
