"""Run one variant as a stream for the UI, and compare two token sequences.

The page shows each token as it arrives; this module only drives pop_analysis.generate and
returns plain dicts (timings, ids, per-layer call counts).
"""
from __future__ import annotations

from pop_analysis.counters import count_calls
from pop_analysis.generate import SamplingConfig, generate


def stream_variant(lm, prompt_ids: list[int], variant: str, skip, cfg: SamplingConfig,
                   on_token=None) -> dict:
    """Generate with call counting on; `on_token(ids_so_far)` after each token. Returns a dict."""
    ids: list[int] = []
    times: list[float] = []
    with count_calls(lm.adapter) as counts:
        for tok in generate(lm, prompt_ids, variant, skip, cfg, counts=counts):
            ids.append(tok.token_id)
            times.append(tok.elapsed_s)
            if on_token is not None:
                on_token(ids)
    ttft = times[0] if times else 0.0
    decode_s = times[-1] - ttft if times else 0.0
    return {"variant": variant, "skip": list(skip), "token_ids": ids, "times": times,
            "ttft_s": ttft, "decode_s": decode_s,
            "decode_tok_s": (len(ids) - 1) / decode_s if len(ids) > 1 and decode_s > 0 else None,
            "counts": counts.as_dict()}


def agreement(a: list[int], b: list[int]) -> tuple[float, int | None]:
    """(share of positions where both sequences hold the same token, first differing index).

    Positions are compared up to the longer length (a missing token counts as a difference);
    the index is None when the sequences are identical.
    """
    n = max(len(a), len(b))
    if n == 0:
        return 1.0, None
    same = sum(1 for i in range(min(len(a), len(b))) if a[i] == b[i])
    first = next((i for i in range(n) if i >= len(a) or i >= len(b) or a[i] != b[i]), None)
    return same / n, first


def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """Each token's text on its own (for highlighting), or its id without a tokenizer."""
    if tokenizer is None:
        return [f"[{i}]" for i in ids]
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
