"""Stage-aware layer importance (virtual gates) on a prompt set, cached in the results store."""
from __future__ import annotations

from pop_analysis.commands._common import (
    COUNT,
    MAX_COUNT,
    SEED,
    TEMPERATURE,
    TOKENS,
    TOP_P,
    Num,
    add_model_args,
    emit_json,
    load,
    quiet_hf,
)
from pop_analysis.data.prompts import BUILTIN_NAME, load_prompts
from pop_analysis.importance.calibrate import CalibrationConfig, cached_calibration, suggest_skip
from pop_analysis.progress import terminal_bar


def add_arguments(p) -> None:
    add_model_args(p)
    d = CalibrationConfig()
    p.add_argument("--dataset", default=BUILTIN_NAME,
                   help="builtin, a .jsonl/.json/.csv/.parquet/.txt file, or hf:NAME[:split]")
    p.add_argument("--field", default=None, help="prompt field (default: detected)")
    p.add_argument("--samples", type=COUNT, default=d.n_samples, help="prompts to calibrate on")
    p.add_argument("--max-new-tokens", type=TOKENS, default=d.max_new_tokens,
                   help="sampled response length bound")
    p.add_argument("--temperature", type=TEMPERATURE, default=d.temperature)
    p.add_argument("--top-p", type=TOP_P, default=d.top_p)
    p.add_argument("--seed", type=SEED, default=d.seed)
    p.add_argument("--batch-size", type=Num(int, 1, 4096), default=d.batch_size,
                   help="prompts per batch (speed only)")
    p.add_argument("--loo-samples", type=Num(int, 0, MAX_COUNT), default=d.loo_samples,
                   help="exact leave-one-layer-out on this many samples (0 = off)")
    p.add_argument("--raw", action="store_true", help="tokenise prompts as is, no chat template")
    p.add_argument("--no-cache", action="store_true", help="recompute even when a result is stored")


def run(args) -> int:
    quiet_hf()
    cfg = CalibrationConfig(n_samples=args.samples, max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                            batch_size=args.batch_size, loo_samples=args.loo_samples, raw=args.raw)
    if args.loo_samples > args.samples:
        raise ValueError(f"--loo-samples {args.loo_samples} is more than the {args.samples} "
                         "samples calibrated on")
    prompts = load_prompts(args.dataset, field=args.field, limit=args.samples)
    lm = load(args)
    result, hit = cached_calibration(lm, prompts, cfg, use_cache=not args.no_cache,
                                     progress=terminal_bar)
    skip = suggest_skip(result)
    if args.json:
        emit_json({"model": result.model, "dataset": result.dataset, "n_samples": result.n_samples,
                   "prefill": result.prefill, "decode": result.decode,
                   "prefill_std": result.prefill_std, "decode_std": result.decode_std,
                   "block_influence": result.block_influence, "seconds": result.seconds,
                   "samples_per_s": result.samples_per_s,
                   "suggested_skip": {k: list(s.layers) for k, s in skip.items()}})
    else:
        print(report(result, hit, skip))
    return 0


def report(result, hit: bool, skip: dict) -> str:
    """A table of importance per layer, then the suggestions."""
    src = ("cached result" if hit else
           f"{result.seconds:.1f} s, {result.samples_per_s:.2f} samples/s")
    lines = [f"{result.model} on {result.dataset}: {result.n_samples} samples ({src})",
             f"{'layer':>5} {'prefill':>12} {'decode':>12} {'BI prefill':>11} {'BI decode':>10}"]
    bi = result.block_influence
    for i in range(result.n_layers):
        lines.append(f"{i:>5} {result.prefill[i]:>12.4g} {result.decode[i]:>12.4g} "
                     f"{bi['prefill'][i]:>11.4f} {bi['decode'][i]:>10.4f}")
    if result.rank_corr:
        rc = {k: "n/a" if v is None else f"{v:.3f}" for k, v in result.rank_corr.items()}
        lines.append(f"Spearman(Taylor, leave-one-out): prefill {rc['prefill']}, "
                     f"decode {rc['decode']}")
    for s in skip.values():
        lines.append(f"{s.name:>9}: layers {', '.join(map(str, s.layers)) or 'none'} "
                     f"(ideal prefill speedup {s.ideal_speedup:.2f}x at 512 tokens) - "
                     f"{s.description}")
    return "\n".join(lines)
