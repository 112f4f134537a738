"""Make the stored example results the dashboard opens with (class mode), for one model.

    python -m pop_analysis examples --model smollm2-135m --threads 2
    python -m pop_analysis examples --model gemma3-270m --parts stepthrough,generation
    python -m pop_analysis examples --model smollm2-135m --parts sweep --retime --threads 2
    python -m pop_analysis examples --model gemma3-270m --parts heal_drift
    python -m pop_analysis examples --model smollm2-135m --parts heal_stepthrough --threads 2

Each part runs the library as the dashboard's defaults would (a calibration of 64 built-in prompts,
drift on the long example prompt, the ratio sweep on GSM8K, a generation and a step-through on the
default prompts, the drift while healing on the long prompt, the step-through again with POP
healing its cache 16 positions per step, the paper's last third skipped) on a
fresh, temporary results store, and copies the store's entry with a label (model, data, machine,
date, this command) to pop_analysis/examples/<model>/<kind>.json; SHA256SUMS is rewritten. The
prompts are the first ones of each set and the default examples, never chosen for how they come
out.

A timing the protocol flags is never stored (speed/example_timings.py says what passes): before
each part with a timing the command waits for a quiet machine (--quiet-wait), and a part whose
timing is still flagged is timed again (the sweep re-times its flagged rows only; its quality
half does not depend on the machine), up to --tries times; then it is refused with one line and
the command exits 1, leaving the shipped file as it was. --retime re-times the shipped sweep's
rows instead of running its quality half again.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

from pop_analysis.commands._common import (
    MAX_WAIT_S,
    Num,
    add_model_args,
    emit_json,
    load,
    quiet_hf,
)
from pop_analysis.data.example_prompts import STEP
from pop_analysis.errors import InputError
from pop_analysis.speed import example_timings
from pop_analysis.store import examples as ex
from pop_analysis.store import results as store
from pop_analysis.store.paths import cache_dir
from pop_vllm.run_setting import RunSetting

PARTS = ex.KINDS
CALIBRATION = {"data": "builtin", "samples": 64, "response_tokens": 32}
SWEEP = {"dataset": "gsm8k", "samples": 64, "new_tokens": 16, "repeats": 3}
# Healing on the long prompt, a budget large enough that the cache is the full model's within
# the recorded steps (the Drift page's default budget, 16, heals a few hundred positions too
# slowly for 12 steps to show the end).
HEAL_DRIFT = {"budget_positions": 64, "chunk": 16, "new_tokens": 12}
STEP_PROMPT = STEP


def add_arguments(p) -> None:
    add_model_args(p)
    p.add_argument("--parts", default=",".join(PARTS), help=f"some of {', '.join(PARTS)}")
    p.add_argument("--out", default=None, help="folder (default: pop_analysis/examples)")
    p.add_argument("--tries", type=Num(int, 1, 20), default=3,
                   help="timings of a part before a flagged one is refused (default 3)")
    p.add_argument("--quiet-wait", type=Num(float, 0, MAX_WAIT_S, unit="seconds"), default=600.0,
                   help="seconds to wait for a quiet machine before each timing (default 600)")
    p.add_argument("--retime", action="store_true",
                   help="sweep: re-time the shipped sweep's rows, keep its quality half")


def run(args) -> int:
    quiet_hf()
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    bad = [x for x in parts if x not in PARTS]
    if bad or not parts:
        raise InputError(f"--parts takes {', '.join(PARTS)}; got {args.parts!r}")
    if args.retime and parts != ["sweep"]:
        raise InputError("--retime re-times the shipped sweep alone: use it with --parts sweep")
    lm = load(args)
    root = Path(args.out) if args.out else None
    written, refused = {}, {}
    with _fresh_store():
        for part in parts:
            print(f"{lm.name}: {part} ...", flush=True)
            entry, quiet = make_part(lm, part, args, root)
            problems = example_timings.problems(part, entry["payload"])
            if problems:
                refused[part] = (f"{lm.name}/{part} not stored: {'; '.join(problems)} (rerun on a "
                                 "quiet machine)")
                print(refused[part], file=sys.stderr, flush=True)
                continue
            written[part] = str(ex.write_example(lm.name, part, entry,
                                                 label(lm, MAKERS[part][0](lm), args, quiet), root))
    emit_json({"written": written, "refused": refused}) if args.json else \
        print("\n".join(written.values()))
    return 1 if refused else 0


def make_part(lm, part: str, args, root) -> tuple[dict, float | None]:
    """(the part's store entry, other processes' cores before its last timing): up to
    args.tries timings, each after a wait for a quiet machine, until none is flagged."""
    if part == "sweep" and args.retime:
        shipped = ex.example_path(lm.name, "sweep", root)
        entry = json.loads(shipped.read_text(encoding="utf-8"))
        entry.pop("example", None)
    else:
        entry = None
    quiet = None
    for attempt in range(args.tries):
        if part in example_timings.CHECKS:
            quiet = _wait(args.quiet_wait)
        if part == "sweep" and entry is not None:
            retime_sweep(lm, entry["payload"])  # the quality half stands; only speed is redone
        else:
            MAKERS[part][1](lm)  # use_cache=False: the part's one store entry is rewritten
            entry = _only_entry(ex.store_kind(part))
        problems = example_timings.problems(part, entry["payload"])
        if not problems:
            break
        print(f"  try {attempt + 1} of {args.tries} flagged: {'; '.join(problems)}", flush=True)
    return entry, quiet


def _wait(max_s: float) -> float | None:
    import torch

    from pop_analysis.speed.quiet import wait_quiet

    if max_s <= 0:
        return None  # --quiet-wait 0: time at once
    ok, cores = wait_quiet(max_s, torch.get_num_threads())
    if not ok:
        print(f"  the machine did not get quiet in {max_s:g} s (other processes: "
              f"{cores if cores is None else round(cores, 2)} cores); timing anyway", flush=True)
    return cores


def retime_sweep(lm, payload: dict) -> None:
    """The sweep's flagged speed rows timed again (the protocol, the sweep's own settings)."""
    from pop_analysis.experiments import sweep as sw
    from pop_analysis.experiments.sweep_speed import speed_fields

    cfg = sw.SweepConfig(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in payload["config"].items()})
    for row in payload["rows"]:
        if row.get("timing_rounds") and example_timings.sweep_problems({"rows": [row]}):
            _wait(60.0)
            setting = RunSetting(tuple(row["skip_layers"]), row["engine_variant"] or row["variant"])
            row.update(speed_fields(lm, setting, row["length"], sw.timing_config(cfg)))

@contextlib.contextmanager
def _fresh_store():
    """POP_LAB_CACHE -> a temporary folder (the converted models linked in): every part computes."""
    models = cache_dir() / "models"
    old = os.environ.get("POP_LAB_CACHE")
    with tempfile.TemporaryDirectory(prefix="poplab_examples_") as tmp:
        (Path(tmp) / "models").symlink_to(models, target_is_directory=True)
        os.environ["POP_LAB_CACHE"] = tmp
        try:
            yield Path(tmp)
        finally:
            if old is None:
                os.environ.pop("POP_LAB_CACHE", None)
            else:
                os.environ["POP_LAB_CACHE"] = old


def _only_entry(kind: str) -> dict:
    (entry,) = store.entries(kind)  # a fresh store holds exactly the one this part made
    return json.loads(store.entry_path(kind, entry["key"]).read_text(encoding="utf-8"))


def label(lm, data: str, args, other: float | None = None) -> dict:
    import torch

    from pop_analysis.speed.machine import cpu_model

    load = os.getloadavg()[0]
    machine = (f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, "
               f"{str(lm.dtype).replace('torch.', '')}, load {load:.1f}"
               + (f", other processes at {other:.2f} cores before the timing" if other is not None
                  else ""))
    return {"model": lm.name, "data": data + (" (timings re-measured)" if args.retime else ""),
            "machine": machine,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": f"python -m pop_analysis examples --model {lm.name} --parts {args.parts}"
                       + (f" --threads {args.threads}" if args.threads else "")
                       + (" --retime" if args.retime else "")}


# ---------------------------------------------------------------- the parts

def _calibration(lm) -> None:
    from pop_analysis.data.prompts import load_prompts
    from pop_analysis.importance import calibrate as cal
    from pop_analysis.progress import terminal_bar

    prompts = load_prompts(CALIBRATION["data"], limit=CALIBRATION["samples"])
    cfg = cal.CalibrationConfig(n_samples=CALIBRATION["samples"],
                                max_new_tokens=CALIBRATION["response_tokens"])
    cal.cached_calibration(lm, prompts, cfg, use_cache=False, progress=terminal_bar)


def _skip(lm):
    from pop_analysis.engine.skipset import preset

    return preset("paper", lm.adapter.n_layers)


def _raw(lm) -> bool:
    return not getattr(lm.tokenizer, "chat_template", None)


def _drift(lm) -> None:
    from pop_analysis.data.example_prompts import LONG
    from pop_analysis.engine.generate import encode
    from pop_analysis.inspection.drift import DriftConfig, cached_drift
    from pop_analysis.progress import terminal_bar

    ids = encode(lm, LONG, raw=_raw(lm))
    cached_drift(lm, ids, RunSetting(_skip(lm)), DriftConfig(), use_cache=False,
                 progress=terminal_bar)


def _sweep(lm) -> None:
    from pop_analysis.experiments import sweep as sw
    from pop_analysis.progress import terminal_bar

    cfg = sw.SweepConfig(dataset=SWEEP["dataset"], n_samples=SWEEP["samples"],
                         max_new_tokens=SWEEP["new_tokens"], repeats=SWEEP["repeats"])
    sw.cached_sweep(lm, "ratio", cfg, use_cache=False, progress=terminal_bar)


def _generation(lm) -> None:
    # The long prompt: at a dozen tokens POP's gain is within the clock's noise (the boundary
    # token and the kept layers dominate), at a few hundred it is the lesson's size.
    from pop_analysis.data.example_prompts import LONG
    from pop_analysis.engine.generate import SamplingConfig, encode
    from pop_analysis.inspection.side_by_side import Caption, cached_generation

    ids = encode(lm, LONG, raw=_raw(lm))
    settings = {"prompt": LONG, "variant": "POP", "decoding": "greedy", "new tokens": 32,
                "raw": _raw(lm)}
    caption = Caption(LONG, "POP (independent KV + boundary)", "POP", settings)
    cached_generation(lm, ids, RunSetting(_skip(lm)), SamplingConfig(max_new_tokens=32), caption,
                      use_cache=False)


def _stepthrough(lm) -> None:
    from pop_analysis.inspection import stepthrough as stp

    ids = stp.encode_short(lm, STEP_PROMPT)
    stp.cached_stepthrough(lm, ids, _skip(lm), stp.StepConfig(), STEP_PROMPT, use_cache=False)


def _heal_stepthrough(lm) -> None:
    from pop_analysis.inspection import stepthrough as stp
    from pop_vllm.healing import make

    # the page's own default: the 37-token prompt heals in three passes, one before each decode
    # step, so the last step decodes from the full model's cache
    cfg = stp.StepConfig(heal=make("budget", budget_positions=stp.HEAL_BUDGET))
    ids = stp.encode_short(lm, STEP_PROMPT)
    stp.cached_stepthrough(lm, ids, _skip(lm), cfg, STEP_PROMPT, use_cache=False)


def _step_heal_budget() -> int:
    from pop_analysis.inspection.stepthrough import HEAL_BUDGET  # imports torch: only when asked

    return HEAL_BUDGET


def _heal_drift(lm) -> None:
    from pop_analysis.data.example_prompts import LONG
    from pop_analysis.engine.generate import encode
    from pop_analysis.inspection.heal_drift import cached_healing_drift
    from pop_vllm.healing import make

    heal = make("budget", HEAL_DRIFT["chunk"], budget_positions=HEAL_DRIFT["budget_positions"])
    cached_healing_drift(lm, encode(lm, LONG, raw=_raw(lm)), RunSetting(_skip(lm), heal=heal),
                         HEAL_DRIFT["new_tokens"], use_cache=False)


MAKERS = {  # part -> (its data, in words; the maker)
    "calibration": (lambda lm: f"{CALIBRATION['samples']} built-in prompts, responses of up to "
                               f"{CALIBRATION['response_tokens']} sampled tokens", _calibration),
    "drift": (lambda lm: "the long example prompt (a town's history), 8 decode steps, the "
                         "paper's last third skipped", _drift),
    "sweep": (lambda lm: f"ratio sweep, first {SWEEP['samples']} GSM8K test items, "
                         f"{SWEEP['new_tokens']} greedy tokens", _sweep),
    "generation": (lambda lm: "the long example prompt (a town's history), 32 greedy tokens, "
                              "the paper's last third skipped", _generation),
    "stepthrough": (lambda lm: f"'{STEP_PROMPT}', the paper's last third skipped", _stepthrough),
    "heal_drift": (lambda lm: "the long example prompt (a town's history), the paper's last third "
                              f"skipped, healed {HEAL_DRIFT['budget_positions']} positions per step "
                              f"in chunks of {HEAL_DRIFT['chunk']}, {HEAL_DRIFT['new_tokens']} "
                              "greedy tokens", _heal_drift),
    "heal_stepthrough": (lambda lm: f"'{STEP_PROMPT}', the paper's last third skipped, POP "
                                    f"healed {_step_heal_budget()} positions per step",
                         _heal_stepthrough),
}
