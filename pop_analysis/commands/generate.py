"""Generate with the full model and POP variants side by side."""
from __future__ import annotations

from ..flops import ideal_speedup
from ..generate import SamplingConfig, encode
from ..generate import run as run_generation
from ..pop import VARIANTS
from ._common import add_model_args, add_skip_args, emit_json, load, quiet_hf, skip_from_args
from ._repair import add_repair_arg, attach_repair, need_repair


def add_arguments(p) -> None:
    add_model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (chat template applied unless --raw)")
    src.add_argument("--prompt-ids", help="comma-separated token ids, e.g. 1,2,3")
    add_skip_args(p, default_ratio=0.33)
    p.add_argument("--variants", default="full,pop", help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--raw", action="store_true", help="tokenise the prompt as is, no chat template")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the untimed warm-up prompt pass (first timings then include warm-up)")
    add_repair_arg(p)


def parse_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def run(args) -> int:
    quiet_hf()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise ValueError(f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")
    if args.repair and "pop_repair" not in variants:
        variants.append("pop_repair")
    need_repair(args, variants)
    lm = load(args)
    skip = skip_from_args(args, lm.adapter.n_layers)
    rep = attach_repair(args, lm, skip, quiet=args.json)
    ids = parse_ids(args.prompt_ids) if args.prompt_ids else encode(lm, args.prompt, raw=args.raw)
    vocab = lm.adapter.shape.vocab
    if any(not 0 <= i < vocab for i in ids):
        raise ValueError(f"--prompt-ids must lie in 0..{vocab - 1}")
    cfg = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_p=args.top_p, seed=args.seed)
    if not args.no_warmup:
        warm_up(lm, ids, variants, skip)
    runs = {v: run_variant(lm, ids, v, skip, cfg, args.json) for v in variants}
    speedup = None
    if "full" in runs and "pop" in runs:
        speedup = runs["full"]["ttft_ms"] / runs["pop"]["ttft_ms"]
    out = {"model": lm.name, "n_layers": lm.adapter.n_layers, "skip_layers": list(skip),
           "prompt_tokens": len(ids), "runs": runs,
           "prefill_speedup": round(speedup, 4) if speedup else None,
           "ideal_speedup": round(ideal_speedup(lm.adapter.shape, len(ids), skip), 4),
           "repair": rep.key if rep else None}
    if args.json:
        emit_json(out)
    elif speedup:
        print(f"prefill speedup (full TTFT / pop TTFT): {speedup:.2f}x "
              f"(ideal {out['ideal_speedup']:.2f}x)")
    return 0


def warm_up(lm, ids, variants, skip) -> None:
    """One untimed prompt pass per variant, so the first timed run pays no allocator warm-up."""
    import torch

    from ..pop import run_prompt

    prompt = torch.tensor([ids], device=lm.device)  # (1, N)
    for v in variants:
        run_prompt(lm.adapter, prompt, v, skip)


def run_variant(lm, ids, variant, skip, cfg, quiet: bool) -> dict:
    g = run_generation(lm, ids, variant, skip, cfg)
    if not quiet:
        print(f"--- {variant}: TTFT {g.ttft_s * 1e3:.1f} ms, "
              f"decode {g.decode_tokens_per_s or 0:.1f} tok/s")
        print(g.text if g.text is not None else g.token_ids)
    return {"text": g.text, "token_ids": g.token_ids, "ttft_ms": round(g.ttft_s * 1e3, 3),
            "decode_tokens_per_s": round(g.decode_tokens_per_s, 3) if g.decode_tokens_per_s else None}
