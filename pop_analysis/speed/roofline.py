"""What the prefill paths must do, op by op: FLOPs and bytes moved, and a roofline time for each.

One op list per path (full, pop and its ablations) follows pop.py's layer loop:
- full: embedding, every layer over the N prompt tokens, the final norm and lm_head for x_N;
- pop: the layers below the first skipped one over all N tokens (x_N rides along: identical
  inputs in both paths), the rest over x_1..x_{N-1} (skipped layers: norm + K/V projection + cache
  write only), then the boundary step: x_N alone through layers first_skipped..L-1, attending to
  the N cached keys;
- pop_no_kv: as pop without the K/V projection; pop_no_boundary / static: all N tokens through
  the pruned stack, no boundary step.

Bytes are the compulsory traffic of an ideal implementation: each weight read once per op, the
op's activations read and written once, K/V written once into the cache (appending, no copy) and
read by attention. Elementwise work (norms, RoPE, SiLU * up, residual adds) moves bytes but counts
no FLOPs, as in the usual matmul-only FLOP count. Per model: a sliding-window layer (Gemma's local
layers) attends to at most W keys per query, so its attention FLOPs and K/V reads stop growing
past W tokens; q/k norms and Gemma's norms of each branch output add elementwise passes.

roofline time of an op = max(FLOPs / matmul rate, bytes / memory bandwidth) with the machine's
measured rates (machine.py); the matmul rate is the one this machine's kernels reach at the op's
row count (a 32-row matmul runs at a fraction of a 2048-row one's rate on a CPU). The FLOP ideal is the ratio of summed FLOPs; the roofline ideal is the
ratio of summed roofline times. They differ where shared work is memory-bound: at 32 tokens the
lm_head (a 49152 x 576 weight read for one token), the boundary step (ten layers' weights read for
one token) and the embedding cost the same in both paths and cap the possible speedup.
"""
from __future__ import annotations

from dataclasses import dataclass

from pop_analysis.engine.adapter import Shape
from pop_vllm.run_setting import RunSetting
from pop_vllm.variants import SkipMode

FULL = RunSetting.full()


@dataclass(frozen=True)
class Op:
    """One unit of work: a matmul, an attention, or an elementwise pass."""

    name: str  # e.g. "L3.q_proj", "lm_head"
    flops: float  # multiply-adds x 2 (0 for elementwise work)
    bytes: float  # bytes read + written (weights, activations, K/V)
    rows: int = 0  # rows of the matmul (batch x tokens); sets the attainable compute rate

    def seconds(self, rates) -> float:
        """max(FLOPs / the matmul rate at this many rows, bytes / bandwidth)."""
        compute = self.flops / rates.flops_at(self.rows) if self.flops else 0.0
        return max(compute, self.bytes / rates.bytes_per_s)


def _linear(name, rows, d_in, d_out, b) -> Op:
    """rows tokens through a d_in x d_out weight."""
    return Op(name, 2.0 * rows * d_in * d_out, b * (d_in * d_out + rows * (d_in + d_out)), rows)


def _elementwise(name, elements_moved, b) -> Op:
    return Op(name, 0.0, b * elements_moved)


def window(s: Shape, i: int) -> int | None:
    """Layer i's sliding window (keys one query attends to), None for global attention."""
    return s.windows[i] if s.windows else None


def attention_span(s: Shape, i: int, past: int, tokens: int) -> tuple[int, int]:
    """(ctx_sum, keys) of layer i for `tokens` queries after `past` cached positions: the keys
    the queries attend to, summed (a query at position t sees min(t, W) of them), and the keys
    read at least once."""
    lo, hi = past + 1, past + tokens  # 1-indexed positions of the queries
    w = window(s, i)
    if w is None or hi <= w:
        return (lo + hi) * tokens // 2, hi
    rising = max(0, w - lo + 1)  # queries still inside the first window
    ramp = (lo + w) * rising // 2 if rising else 0
    return ramp + (tokens - rising) * w, min(hi, w + tokens - 1)


def layer_ops(s: Shape, i: int, tokens: int, ctx_sum: int, keys: int, b: int = 4,
              batch: int = 1) -> list[Op]:
    """Layer i in full over `tokens` new tokens per row whose attention spans add up to ctx_sum
    keys; `keys` cached keys per row are read by attention."""
    dq, dkv, d, ff = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim, s.hidden, s.intermediate
    rows = batch * tokens
    p = f"L{i}."
    return [
        _elementwise(p + "norm1", 2 * rows * d, b),
        _linear(p + "q_proj", rows, d, dq, b),
        _linear(p + "k_proj", rows, d, dkv, b),
        _linear(p + "v_proj", rows, d, dkv, b),
        *_qk_norms(s, p, rows, dq, dkv, b),
        _elementwise(p + "rope", 2 * rows * (dq + dkv), b),
        _elementwise(p + "kv_write", 2 * rows * dkv, b),
        Op(p + "attention", 4.0 * batch * dq * ctx_sum,
           b * batch * (2 * tokens * dq + 2 * keys * dkv), rows),
        _linear(p + "o_proj", rows, dq, d, b),
        *_branch_norm(s, p + "post_attn_norm", rows, d, b),
        _elementwise(p + "residual1", 3 * rows * d, b),
        _elementwise(p + "norm2", 2 * rows * d, b),
        _linear(p + "gate_proj", rows, d, ff, b),
        _linear(p + "up_proj", rows, d, ff, b),
        _elementwise(p + "act_mul", 3 * rows * ff, b),
        _linear(p + "down_proj", rows, ff, d, b),
        *_branch_norm(s, p + "post_ffn_norm", rows, d, b),
        _elementwise(p + "residual2", 3 * rows * d, b),
    ]


def _qk_norms(s: Shape, p: str, rows: int, dq: int, dkv: int, b: int, q: bool = True) -> list[Op]:
    if not s.qk_norm:
        return []
    return ([_elementwise(p + "q_norm", 2 * rows * dq, b)] if q else []) + \
        [_elementwise(p + "k_norm", 2 * rows * dkv, b)]


def _branch_norm(s: Shape, name: str, rows: int, d: int, b: int) -> list[Op]:
    return [_elementwise(name, 2 * rows * d, b)] if s.branch_norms else []


def kv_only_ops(s: Shape, i: int, tokens: int, b: int = 4, batch: int = 1) -> list[Op]:
    """POP's independent K/V of skipped layer i: norm, k/v projections, k_norm where the model
    has one, RoPE on k, cache write."""
    dkv, d, rows = s.n_kv_heads * s.head_dim, s.hidden, batch * tokens
    p = f"L{i}."
    return [_elementwise(p + "norm1", 2 * rows * d, b), _linear(p + "k_proj", rows, d, dkv, b),
            _linear(p + "v_proj", rows, d, dkv, b), *_qk_norms(s, p, rows, 0, dkv, b, q=False),
            _elementwise(p + "rope_k", 2 * rows * dkv, b),
            _elementwise(p + "kv_write", 2 * rows * dkv, b)]


def chunk_ops(s: Shape, i: int, past: int, tokens: int, kv_only: bool = False, b: int = 4) -> list[Op]:
    """Layer i over `tokens` consecutive positions after `past` cached ones: in full, or only
    POP's K/V projection (the step-through counts each step's work from what ran)."""
    if kv_only:
        return kv_only_ops(s, i, tokens, b)
    return layer_ops(s, i, tokens, *attention_span(s, i, past, tokens), b)


def embed_ops(s: Shape, n: int, b: int = 4) -> list[Op]:
    return _embed(s, n, b, 1)


def head_ops(s: Shape, b: int = 4) -> list[Op]:
    """Final norm and lm_head for one position (the token a step chooses)."""
    return _head(s, b, 1)


def _embed(s, n, b, batch) -> list[Op]:
    return [_elementwise("embedding", 2 * batch * n * s.hidden, b)]


def _head(s, b, batch) -> list[Op]:
    """Final norm and lm_head for the last position only."""
    return [_elementwise("final_norm", 2 * batch * s.hidden, b),
            _linear("lm_head", batch, s.hidden, s.vocab, b)]


def prefill_ops(s: Shape, n: int, setting: RunSetting = FULL, b: int = 4,
                batch: int = 1) -> list[Op]:
    """Every op from prompt ids (B, n) to the first token's logits, for one setting (pop_repair's
    fitted K/V maps have the shape of the projections they replace: pop's work)."""
    skip = frozenset(setting.skip) if setting.active else frozenset()
    ops = _embed(s, n, b, batch)
    if not setting.boundary or not skip:
        for i in range(s.n_layers):  # one pass over all n tokens, skipped layers pruned
            ops += _pruned_layer(s, i, n, setting, b, batch)
        return ops + _head(s, b, batch)
    first, m = min(skip), n - 1
    for i in range(first):  # the shared trunk: x_N rides along with the prompt
        ops += layer_ops(s, i, n, *attention_span(s, i, 0, n), b, batch)
    for i in range(first, s.n_layers):  # x_1..x_{N-1} through the pruned rest
        ops += _pruned_layer(s, i, m, setting, b, batch) if m else []
    for i in range(first, s.n_layers):  # the boundary step: x_N alone, attending to all keys
        if i in skip and setting.skip_mode == SkipMode.DROP:
            ops += layer_ops(s, i, 1, 1, 1, b, batch)  # its own key only
        else:
            ops += layer_ops(s, i, 1, *attention_span(s, i, n - 1, 1), b, batch)
    return ops + _head(s, b, batch)


def _pruned_layer(s, i, tokens, setting: RunSetting, b, batch) -> list[Op]:
    if not setting.active or i not in setting.skip:
        return layer_ops(s, i, tokens, *attention_span(s, i, 0, tokens), b, batch)
    kv = setting.skip_mode in (SkipMode.KV, SkipMode.REPAIR)
    return kv_only_ops(s, i, tokens, b, batch) if kv else []


def total_flops(ops) -> float:
    return sum(op.flops for op in ops)


def roofline_seconds(ops, rates) -> float:
    """The time an ideal implementation needs at the machine's rates (each op at its own bound)."""
    return sum(op.seconds(rates) for op in ops)


def roofline_speedup(s: Shape, n: int, setting: RunSetting, rates, b: int = 4,
                     batch: int = 1) -> float:
    """Roofline time of the full path / that of `setting`."""
    full = roofline_seconds(prefill_ops(s, n, FULL, b, batch), rates)
    return full / roofline_seconds(prefill_ops(s, n, setting, b, batch), rates)


def breakdown(s: Shape, n: int, setting: RunSetting, rates, b: int = 4, batch: int = 1) -> dict:
    """Roofline seconds by kind of work and its bound (the docs' view of short prompts)."""
    out: dict[str, float] = {}
    for op in prefill_ops(s, n, setting, b, batch):
        memory = op.bytes / rates.bytes_per_s >= (op.flops / rates.flops_at(op.rows)
                                                  if op.flops else 0.0)
        key = f"{op.name.split('.')[-1]} ({'memory' if memory else 'compute'})"
        out[key] = out.get(key, 0.0) + op.seconds(rates)
    return out
