"""Representation drift of POP vs the full model: hidden, K, V, attention output, next token."""
from __future__ import annotations

from pop_analysis.commands._common import (
    COUNT,
    MAX_TOKENS,
    TOKENS,
    Num,
    NumList,
    add_model_args,
    add_skip_args,
    emit_json,
    load,
    quiet_hf,
    skip_from_args,
)
from pop_analysis.commands._repair import add_repair_arg, attach_repair
from pop_analysis.data.prompts import load_prompts
from pop_analysis.engine.generate import encode
from pop_analysis.engine.pop import check_prompt
from pop_analysis.engine.skipset import describe
from pop_analysis.inspection.drift import QUANTITIES, DriftConfig, average, cached_drift
from pop_analysis.inspection.drift_length import cached_drift_by_length, read_texts
from pop_analysis.progress import terminal_bar
from pop_analysis.store.schema import plain
from pop_vllm.run_setting import RunSetting


def add_arguments(p) -> None:
    add_model_args(p)
    add_skip_args(p, default_ratio=0.33)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", default=None, help="one prompt text")
    src.add_argument("--dataset", default=None,
                     help="prompts: builtin or a .jsonl/.json/.csv/.parquet/.txt file")
    p.add_argument("--samples", type=COUNT, default=3, help="prompts from --dataset (default 3)")
    p.add_argument("--raw", action="store_true", help="no chat template")
    p.add_argument("--decode-steps", type=TOKENS, default=8, help="next-token steps compared (K)")
    p.add_argument("--max-tokens-plot", type=TOKENS, default=256, help="heatmap columns at most")
    p.add_argument("--lengths", type=NumList(Num(int, 2, MAX_TOKENS)), default=None,
                   help="also drift against context length, e.g. 128,512,1024,2048")
    p.add_argument("--text-source", default=None,
                   help="text for --lengths: builtin or a .txt/.jsonl file (default: --dataset, "
                        "else the builtin prompts)")
    p.add_argument("--no-cache", action="store_true", help="recompute instead of reading the cache")
    add_repair_arg(p)  # with a repair: pop_repair's drift beside pop's (before / after)


def run(args) -> int:
    quiet_hf()
    lengths = _parse_lengths(args.lengths)
    cfg = DriftConfig(decode_steps=args.decode_steps, max_tokens_plot=args.max_tokens_plot)
    texts = _prompt_texts(args)
    if lengths:
        read_texts(args.text_source or args.dataset)  # a bad file fails before any model work
    lm = load(args)
    skip = skip_from_args(args, lm.adapter.n_layers)
    prompts = [encode(lm, text, raw=args.raw) for text in texts]
    for n in [len(ids) for ids in prompts] + lengths:  # every check before the first run
        check_prompt(lm.adapter, n, cfg.decode_steps)
    rep = attach_repair(args, lm, skip, quiet=args.json)
    variants = ["pop", "pop_repair"] if rep else ["pop"]
    results = {v: [] for v in variants}
    for n, ids in enumerate(prompts, 1):
        for v in variants:
            bar = _labelled(f"prompt {n}/{len(texts)}")
            setting = RunSetting(skip, v)
            results[v].append(cached_drift(lm, ids, setting, cfg, not args.no_cache, bar)[0])
    result = average(results["pop"])
    repaired = average(results["pop_repair"]) if rep else None
    by_length = []
    if lengths:
        source = args.text_source or args.dataset
        by_length, _ = cached_drift_by_length(lm, lengths, RunSetting(skip), cfg, source,
                                              not args.no_cache, terminal_bar)
    if args.json:
        out = _payload(result, by_length)
        if repaired:
            out.update(repair=rep.key, pop_repair=_payload(repaired, []))
        emit_json(plain(out))
    else:
        _print(result, by_length)
        if repaired:
            _print_repair(result, repaired, rep.key)
    return 0


def _parse_lengths(text: str | None) -> list[int]:
    return list(text or [])


def _prompt_texts(args) -> list[str]:
    if args.prompt is not None:
        return [args.prompt]
    if args.samples < 1:
        raise ValueError("--samples must be at least 1")
    return list(load_prompts(args.dataset, limit=args.samples).prompts)


def _labelled(label: str):
    return lambda u: terminal_bar(type(u)(u.done, u.total, u.elapsed_s, f"{label} {u.message}"))


def _payload(r, by_length: list[dict]) -> dict:
    out = {"model": r.model, "skip_layers": r.skip_layers}
    out.update({f"{q}_cos": getattr(r, f"{q}_cos") for q in QUANTITIES})
    out.update({"kl": r.kl, "top1_agree": r.top1_agree, "by_length": by_length})
    out.update({f"{q}_min": getattr(r, f"{q}_min") for q in QUANTITIES})
    out.update({"n_layers": r.n_layers, "n_prompts": r.n_prompts, "prompt_tokens": r.prompt_tokens,
                "block_means": r.block_means()})
    return out


def _print_repair(pop, fixed, key: str) -> None:
    """Skipped layers' cosines before (pop) and after (pop_repair) the repair."""
    print(f"\nrepair {key}: cosine to the full model, pop -> pop_repair")
    print(f"{'layer':>5}  " + "  ".join(f"{q:>15}" for q in ("K", "V", "attn out")))
    for i in pop.skip_layers:
        cells = [f"{_num(getattr(r, f'{q}_cos')[i], 6, 4)}" for q in ("k", "v", "attn_out")
                 for r in (pop, fixed)]
        print(f"{i:>5}  " + "  ".join(f"{a} -> {b}" for a, b in zip(cells[::2], cells[1::2])))
    before, after = pop.block_means(), fixed.block_means()
    print("block mean: " + ", ".join(f"{q[:-4]} {before[q]:.4f} -> {after[q]:.4f}" for q in before))
    print("mean KL(full||x): " + f"{sum(pop.kl) / len(pop.kl):.4f} -> "
          f"{sum(fixed.kl) / len(fixed.kl):.4f}")


def _num(x, width: int, digits: int) -> str:
    """A cosine for the table; n/a where a sliding-window cache held no position."""
    return f"{x:{width}.{digits}f}" if x is not None and x == x else f"{'n/a':>{width}}"


def _print(r, by_length: list[dict]) -> None:
    print(f"model {r.model}, skip {describe(r.skip_layers)}, {r.n_prompts} prompt(s); "
          "cosine POP vs full, mean (min)")
    print(f"{'layer':>5}  {'hidden':>15}  {'K':>15}  {'V':>15}  {'attn out':>15}")
    for i in range(r.n_layers):
        mark = "*" if i in r.skip_layers else " "
        cells = "  ".join(f"{_num(getattr(r, f'{q}_cos')[i], 7, 4)} "
                          f"({_num(getattr(r, f'{q}_min')[i], 5, 3)})" for q in QUANTITIES)
        print(f"{i:>4}{mark}  {cells}")
    means = r.block_means()
    print("block mean: " + ", ".join(f"{q[:-4]} {v:.4f}" for q, v in means.items()))
    print("decode step:   " + " ".join(f"{j:>6}" for j in range(len(r.kl))))
    print("KL(full||pop): " + " ".join(f"{x:6.4f}" for x in r.kl))
    print("top-1 agree:   " + " ".join(f"{x:6.2f}" for x in r.top1_agree))
    for row in by_length:  # a mean with no number behind it is stored as null
        print(f"{row['length']:>6} tokens: hidden {_num(row['hidden_cos'], 6, 4)}  "
              f"K {_num(row['k_cos'], 6, 4)}  V {_num(row['v_cos'], 6, 4)}  "
              f"attn {_num(row['attn_out_cos'], 6, 4)}  KL {_num(row['kl'], 6, 4)}  "
              f"top-1 {_num(row['top1_agree'], 4, 2)}")
