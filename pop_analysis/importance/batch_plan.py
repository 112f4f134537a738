"""How calibration splits its prompts into batches: similar lengths together, sizes as equal as
the count allows, and no batch whose autograd graph would not fit in the memory there is.

A batch's peak memory is dominated by the activations autograd keeps for the backward of the
gated passes: about ACTIVATION_FLOATS x (D + I) floats per token and layer (fitted from the peak
resident memory `bench/calibrate_bench.py batch` measured: see docs/benchmarks.md), for every
prompt and response token of every row. Rows beyond what half the available memory holds are put
off to the next batch instead of swapping or failing.
"""
from __future__ import annotations

DEFAULT_ROWS = 32  # rows per batch when the caller does not choose (measured: docs/benchmarks.md)
ACTIVATION_FLOATS = 5.0  # kept floats per token, layer and (D + I): 4.65 measured, rounded up
MEMORY_SHARE = 0.5  # of the available memory one batch may take


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _token_unit(shape, dtype_bytes: int) -> int:
    """Bytes of one float per (D + I) in every layer: the unit ACTIVATION_FLOATS counts in."""
    return (shape.hidden + shape.intermediate) * shape.n_layers * dtype_bytes


def bytes_per_row(shape, tokens: int, dtype_bytes: int = 4) -> float:
    """Estimated autograd memory of one row of `tokens` prompt + response positions."""
    return ACTIVATION_FLOATS * _token_unit(shape, dtype_bytes) * tokens


def kept_floats(shape, graph_bytes: int, tokens: int, dtype_bytes: int = 4) -> float:
    """A measured graph in ACTIVATION_FLOATS' unit: floats kept per token, layer and (D + I)."""
    return graph_bytes / _token_unit(shape, dtype_bytes) / tokens


def rows_that_fit(shape, tokens: int, available: int | None, dtype_bytes: int = 4) -> int | None:
    """The most rows whose estimated graph fits in MEMORY_SHARE of `available`; None = no limit
    known (the caller's size stands)."""
    if available is None:
        return None
    return max(1, int(MEMORY_SHARE * available // bytes_per_row(shape, tokens, dtype_bytes)))


def plan_batches(lengths: list[int], rows: int) -> list[list[int]]:
    """Indices of the prompts, sorted by length (less padding per batch), cut into the fewest
    batches of at most `rows`, their sizes differing by at most one (no small last batch)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if not order:
        return []
    n_batches = -(-len(order) // max(1, rows))
    base, extra = divmod(len(order), n_batches)
    out, start = [], 0
    for j in range(n_batches):
        size = base + (1 if j < extra else 0)
        out.append(order[start:start + size])
        start += size
    return out

