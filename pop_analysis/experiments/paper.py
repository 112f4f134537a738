"""The paper's reported numbers (POP_METHOD.md sections 4-7), for side-by-side display."""
from __future__ import annotations

PAPER_TABLES: dict = {
    "table2": {
        "title": "Prefill (TTFT) speedup vs input length, POP at ~1/3 (A100, batch 8)",
        "lengths": [32, 128, 512, 2048],
        "rows": {"Llama-3.1-8B": [1.22, 1.27, 1.34, 1.36], "Gemma-3-12B": [1.02, 1.27, 1.34, 1.37]},
    },
    "table3": {
        "title": "Design ablations (Qwen3-VL-8B), accuracy %",
        "columns": ["GSM8K", "HotpotQA"],
        "rows": {"full": [81.50, 65.49], "pop": [80.21, 63.13], "shallow": [0.15, 0.00],
                 "interleaved": [56.48, 6.81], "pop_no_kv": [2.05, 1.18],
                 "pop_no_boundary": [77.33, 11.45]},
        "static": "stage-agnostic removal (ShortGPT 25%): Llama-3.1-8B GSM8K 79.68 -> 0.38",
    },
    "table4": {
        "title": "Pruning-ratio sweep (Qwen3-VL-8B, 1024 tokens, batch 4)",
        "ratios": [0.0, 0.2, 0.25, 0.33, 0.4, 0.5, 0.6],
        "prefill_speedup": [1.00, 1.19, 1.25, 1.37, 1.46, 1.67, 1.96],
        "GSM8K": [81.50, 83.09, 82.34, 80.21, 80.82, 78.54, 38.51],
        "HotpotQA": [65.49, 65.46, 65.81, 63.13, 61.69, 34.69, 5.45],
        "note": "ideal speedup 1/(1-p); measured values are 75-95% of it",
    },
    "table1": {
        "title": "Accuracy, Llama-3.1-8B-Instruct, full vs POP (31.25%)",
        "columns": ["full", "pop"],
        "rows": {"MMLU": [68.33, 67.43], "HellaSwag": [79.50, 78.29], "GSM8K": [79.68, 77.26],
                 "HumanEval": [68.29, 64.63], "HotpotQA": [55.66, 53.48], "average": [70.19, 68.47]},
    },
}


# Appendix: cosine POP vs full over the skipped block (Qwen3-VL-8B, layers 25-36), POP_METHOD.md §8.
# quantity -> (value, what the paper says of it); K is plotted there, not quoted.
PAPER_DRIFT = {"hidden": (0.71, "falls to about 0.71 by the last layer"),
               "v": (0.46, "falls as low as 0.46"),
               "attn_out": (0.96, "stays above 0.96 in every skipped layer")}


def paper_frame(table: str):
    """One of PAPER_TABLES as a DataFrame (rows x columns) for side-by-side display."""
    import pandas as pd

    t = PAPER_TABLES[table]
    if table == "table4":
        return pd.DataFrame({k: t[k] for k in ("ratios", "prefill_speedup", "GSM8K", "HotpotQA")})
    cols = t.get("columns") or [str(n) for n in t["lengths"]]
    return pd.DataFrame.from_dict(t["rows"], orient="index", columns=cols)


def table2_speedups() -> dict[str, dict[int, float]]:
    """Table 2 as {model: {prompt length: TTFT speedup}}."""
    t = PAPER_TABLES["table2"]
    return {model: dict(zip(t["lengths"], row)) for model, row in t["rows"].items()}
