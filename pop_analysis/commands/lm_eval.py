"""Run lm-evaluation-harness with the POP model "pop-hf" registered (args go to lm-eval)."""
from __future__ import annotations

import argparse
import sys

EXAMPLE = ("example: python -m pop_analysis lm_eval run --model pop-hf --model_args "
           "pretrained=smollm2-135m,skip_ratio=0.33 --tasks arc_easy --limit 20 "
           "(or put '--' before lm-eval's own options)")


def add_arguments(p) -> None:
    p.epilog = EXAMPLE
    p.add_argument("harness_args", nargs=argparse.REMAINDER,
                   help="lm-eval's arguments, starting with its subcommand (run, ls, validate) "
                        "or after '--'")


def harness_argv(args) -> list[str]:
    rest = list(args.harness_args)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if not rest:
        raise ValueError(f"give lm-eval's arguments; {EXAMPLE}")
    return with_device(rest)


def with_device(rest: list[str]) -> list[str]:
    """lm-eval's own default device is cuda:0, even on a machine without CUDA: unless the
    arguments name one (or a config file may), add the project's choice (cuda if present, else
    cpu). model_args' device= still wins inside pop-hf."""
    named = any(a in ("--device", "--config", "-C") or a.startswith(("--device=", "--config="))
                for a in rest)
    if named or rest[0] in ("ls", "validate", "-h", "--help"):
        return rest
    from pop_analysis.engine.models import default_device

    return [*rest, "--device", default_device()]


def with_local_tasks(rest: list[str]) -> list[str]:
    """Point lm-eval at POP Lab's local task files when a pop_* task is asked for."""
    tasks = next((rest[i + 1] for i, a in enumerate(rest[:-1]) if a == "--tasks"), "")
    if "--include_path" in rest or not any(t.startswith("pop_") for t in tasks.split(",")):
        return rest
    from pop_analysis.harness.mc import task_dir

    return [*rest, "--include_path", str(task_dir())]


def run(args) -> int:
    rest = with_local_tasks(harness_argv(args))
    from lm_eval.__main__ import cli_evaluate

    from pop_analysis.harness import lm_eval_model  # noqa: F401 - importing registers "pop-hf"

    saved = sys.argv
    sys.argv = ["lm-eval", *rest]  # lm-eval's parser reads sys.argv (and inserts "run" if absent)
    try:
        cli_evaluate()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    return 0
