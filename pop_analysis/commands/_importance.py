"""Options shared by `importance` and `choose`: the prompts that rank the layers and the
held-out items that measure a skip set."""
from __future__ import annotations

from pop_analysis.commands._common import COUNT, MAX_COUNT, MAX_TOKENS, SEED, TOKENS, Num
from pop_analysis.data.prompts import BUILTIN_NAME, load_prompts
from pop_analysis.experiments.methods_run import ImportanceConfig, cached_importance
from pop_analysis.quality.evalsets import NAMED, data_dir


def add_ranking_args(p, samples: int = 32) -> None:
    d = ImportanceConfig()
    p.add_argument("--dataset", default=BUILTIN_NAME,
                   help="prompts that rank the layers: builtin, wizardlm, gsm8k, selfinstruct, a "
                        ".jsonl/.json/.csv/.parquet/.txt file or hf:NAME[:split]")
    p.add_argument("--field", default=None, help="prompt field (default: detected)")
    p.add_argument("--samples", type=COUNT, default=samples, help="prompts, the same for every method")
    p.add_argument("--new-tokens", type=TOKENS, default=d.new_tokens,
                   help="gate: sampled response bound; drop-one: tokens of the full model's "
                        "continuation scored")
    p.add_argument("--seed", type=SEED, default=d.seed, help="gate sampling and random baseline seed")
    p.add_argument("--raw", action="store_true", help="tokenise prompts as is, no chat template")
    p.add_argument("--resamples", type=Num(int, 1, 100_000), default=d.resamples,
                   help="bootstrap resamples of the agreement intervals")
    p.add_argument("--no-cache", action="store_true", help="recompute even when a result is stored")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_eval_args(p, samples: int) -> None:
    p.add_argument("--eval-dataset", default="gsm8k",
                   help="held-out items that measure each skip set (gsm8k: questions with "
                        "reference answers; a .jsonl file; wizardlm: the full model's continuation)")
    p.add_argument("--eval-samples", type=COUNT, default=samples, help="held-out items")
    p.add_argument("--offset", type=Num(int, 0, MAX_COUNT), default=0,
                   help="items of the held-out set skipped first (when it is the ranking's own set)")
    p.add_argument("--answer-tokens", type=Num(int, 0, MAX_TOKENS), default=32,
                   help="reference tokens scored per item (0: the whole reference)")
    p.add_argument("--bench-tokens", type=TOKENS, default=512,
                   help="prompt length of the FLOP ideal and the timed speedup")
    p.add_argument("--no-speed", action="store_true", help="no timed speedups (the FLOP ideal only)")


def prompt_source(name: str) -> str:
    """A named shared data set (gsm8k, wizardlm ...) as its file; anything else as given."""
    return str(data_dir() / NAMED[name]) if name in NAMED else name


def ranking_config(args, methods) -> ImportanceConfig:
    return ImportanceConfig(methods=tuple(methods), n_samples=args.samples,
                            new_tokens=args.new_tokens, seed=args.seed, raw=args.raw,
                            resamples=args.resamples)


def ranking(args, lm, cfg: ImportanceConfig, bar):
    """The stored (or computed) importance run of cfg on --dataset."""
    prompts = load_prompts(prompt_source(args.dataset), field=args.field, limit=cfg.n_samples)
    return cached_importance(lm, prompts, cfg, not args.no_cache, bar)
