"""Generate with the full model and POP variants side by side."""
from __future__ import annotations

from pop_analysis.commands._common import (
    SEED,
    TEMPERATURE,
    TOKENS,
    TOP_P,
    Num,
    NumList,
    add_model_args,
    add_skip_args,
    emit_json,
    load,
    quiet_hf,
    seconds,
    setting_from_args,
)
from pop_analysis.commands._heal import add_heal_args, heal_from_args
from pop_analysis.commands._repair import add_repair_arg, attach_repair, need_repair
from pop_analysis.engine.generate import SamplingConfig, encode
from pop_analysis.engine.generate import run as run_generation
from pop_analysis.engine.pop import check_prompt
from pop_vllm.healing import NO_HEAL
from pop_vllm.healing import check_variant as check_heal_variant
from pop_analysis.speed.timing import (
    MAX_BUDGET_S,
    MAX_ROUNDS,
    TimingConfig,
    check_budget,
    check_rounds,
)
from pop_vllm.run_setting import RunSetting
from pop_vllm.variants import VARIANTS

TOKEN_ID = Num(int, 0, (1 << 31) - 1)  # checked against the vocabulary once the model loads


def add_arguments(p) -> None:
    add_model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (chat template applied unless --raw)")
    src.add_argument("--prompt-ids", type=NumList(TOKEN_ID), help="comma-separated token ids, e.g. 1,2,3")
    add_skip_args(p, default_ratio=0.33)
    p.add_argument("--variants", default="full,pop", help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--max-new-tokens", type=TOKENS, default=32)
    p.add_argument("--temperature", type=TEMPERATURE, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=TOP_P, default=1.0)
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--raw", action="store_true", help="tokenise the prompt as is, no chat template")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the untimed warm-up prompt pass (first timings then include warm-up)")
    add_repair_arg(p)
    add_heal_args(p)
    p.add_argument("--timing-rounds", type=Num(int, 1, MAX_ROUNDS), default=3,
                   help="fewest timed rounds of the prefill speedup (at least 3 are run)")
    p.add_argument("--timing-budget", type=seconds(MAX_BUDGET_S), default=2.0, metavar="SECONDS",
                   help="more timing rounds while they fit in this many seconds")


def run(args) -> int:
    quiet_hf()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise ValueError(f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")
    if args.repair and "pop_repair" not in variants:
        variants.append("pop_repair")
    need_repair(args, variants)
    heal = heal_from_args(args)
    for v in variants:
        check_heal_variant(heal, v)
    timing = TimingConfig(min_rounds=check_rounds(args.timing_rounds),
                          budget_s=check_budget(args.timing_budget), warmup=0)
    cfg = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_p=args.top_p, seed=args.seed)
    given = args.prompt_ids  # None: --prompt
    lm = load(args)
    base = setting_from_args(args, lm.adapter.n_layers)
    # The full model's cache is exact already: its run never heals.
    settings = {v: base.replace(variant=v, heal=NO_HEAL if v == "full" else heal) for v in variants}
    skip = base.skip
    ids = given if given is not None else encode(lm, args.prompt, raw=args.raw)
    vocab = lm.adapter.shape.vocab
    if any(not 0 <= i < vocab for i in ids):
        raise ValueError(f"--prompt-ids must lie in 0..{vocab - 1}")
    check_prompt(lm.adapter, len(ids), cfg.max_new_tokens)  # before any model work
    rep = attach_repair(args, lm, skip, quiet=args.json)
    if not args.no_warmup:
        warm_up(lm, ids, settings.values())
    runs = {v: run_variant(lm, ids, s, cfg, args.json) for v, s in settings.items()}
    out = {"model": lm.name, "n_layers": lm.adapter.n_layers, "skip_layers": list(skip),
           "prompt_tokens": len(ids), "heal": heal.as_dict(), "runs": runs,
           **speed_fields(lm, ids, settings, timing),
           "repair": rep.key if rep else None}
    if args.json:
        emit_json(out)
    elif out["prefill_speedup"]:
        print(speed_line(out))
    return 0


def speed_fields(lm, ids, settings: dict[str, RunSetting], timing) -> dict:
    """TTFT speedup of pop over full through the timing protocol (the streamed runs above
    warmed both paths). Per-run ttft_ms values are single streamed runs, shown for reading."""
    from pop_analysis.speed.bench import time_prefill
    from pop_analysis.speed.flops import ideal_speedup

    pop = next(iter(settings.values())).replace(variant="pop")
    if not {"full", "pop"} <= set(settings):
        return {"prefill_speedup": None,
                "ideal_speedup": round(ideal_speedup(lm.adapter.shape, len(ids), pop), 4)}
    import torch

    p = time_prefill(lm, torch.tensor([ids], device=lm.device), pop, timing)  # (1, N)
    t = p.timing
    return {"prefill_speedup": round(p.speedup, 4), "ideal_speedup": round(p.ideal_speedup, 4),
            **p.fields(), "timing": {"full_ms": [round(x, 3) for x in t.full_ms],
                                     "pop_ms": [round(x, 3) for x in t.variant_ms],
                                     "first": t.first}}


def speed_line(out: dict) -> str:
    lo, hi = out["speedup_range"]
    line = (f"prefill speedup (full TTFT / pop TTFT): {out['prefill_speedup']:.2f}x "
            f"[{lo:.2f}-{hi:.2f} over {out['timing_rounds']} rounds] "
            f"(ideal {out['ideal_speedup']:.2f}x FLOPs, {out['roofline_speedup']:.2f}x roofline)")
    return line if out["timing_trustworthy"] else f"{line}\nNOT TRUSTWORTHY: {out['timing_note']}"


def warm_up(lm, ids, settings) -> None:
    """One untimed prompt pass per setting, so the first timed run pays no allocator warm-up."""
    import torch

    from pop_analysis.engine.pop import run_prompt

    prompt = torch.tensor([ids], device=lm.device)  # (1, N)
    for s in settings:
        run_prompt(lm.adapter, prompt, s)


def run_variant(lm, ids, setting: RunSetting, cfg, quiet: bool) -> dict:
    """One streamed generation of `setting` (its healing with it)."""
    g = run_generation(lm, ids, setting, cfg)
    if not quiet:
        print(f"--- {setting.variant}: TTFT {g.ttft_s * 1e3:.1f} ms, "
              f"decode {g.decode_tokens_per_s or 0:.1f} tok/s" + heal_words(g.heal))
        print(g.text if g.text is not None else g.token_ids)
    return {"text": g.text, "token_ids": g.token_ids, "ttft_ms": round(g.ttft_s * 1e3, 3),
            "decode_tokens_per_s": round(g.decode_tokens_per_s, 3) if g.decode_tokens_per_s else None,
            "heal": g.heal}


def heal_words(rep: dict | None) -> str:
    if not rep:
        return ""
    what = (f"exact from token {rep['horizon_tokens']}" if rep["finished"] else
            f"unfinished: {rep['healed_positions']} of {rep['positions']} positions")
    budget = rep["budget_positions"] or (f"{rep['budget_ms']:g}ms" if rep["budget_ms"] else None)
    return f", heal {rep['policy']}{f' {budget}' if budget else ''} chunk {rep['chunk']}: {what}"
