"""Make the stored example results the dashboard opens with (class mode), for one model.

    python -m pop_analysis examples --model smollm2-135m --threads 2
    python -m pop_analysis examples --model gemma3-270m --parts stepthrough,generation

Each part runs the library as the dashboard's defaults would (a calibration of 64 built-in
prompts, drift on the long example prompt, the ratio sweep on GSM8K, a generation and a
step-through on the default prompts, the paper's last third skipped) on a fresh, temporary results
store, and copies the store's entry with a label (model, data, machine, date, this command) to
pop_analysis/examples/<model>/<kind>.json; SHA256SUMS is rewritten. The prompts are the first
ones of each set and the default examples, never chosen for how they come out.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
from pathlib import Path

from pop_analysis.commands._common import add_model_args, emit_json, load, quiet_hf
from pop_analysis.data.example_prompts import STEP
from pop_analysis.errors import InputError
from pop_analysis.store import examples as ex
from pop_analysis.store import results as store
from pop_analysis.store.paths import cache_dir

PARTS = ex.KINDS
CALIBRATION = {"data": "builtin", "samples": 64, "response_tokens": 32}
SWEEP = {"dataset": "gsm8k", "samples": 64, "new_tokens": 16, "repeats": 3}
STEP_PROMPT = STEP


def add_arguments(p) -> None:
    add_model_args(p)
    p.add_argument("--parts", default=",".join(PARTS), help=f"some of {', '.join(PARTS)}")
    p.add_argument("--out", default=None, help="folder (default: pop_analysis/examples)")


def run(args) -> int:
    quiet_hf()
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    bad = [x for x in parts if x not in PARTS]
    if bad or not parts:
        raise InputError(f"--parts takes {', '.join(PARTS)}; got {args.parts!r}")
    lm = load(args)
    root = Path(args.out) if args.out else None
    written = {}
    with _fresh_store():
        for part in parts:
            data, make = MAKERS[part]
            print(f"{lm.name}: {part} ...", flush=True)
            make(lm)
            entry = _only_entry(part)
            written[part] = str(ex.write_example(lm.name, part, entry, label(lm, data(lm), args),
                                                 root))
    emit_json(written) if args.json else print("\n".join(written.values()))
    return 0


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
    import json

    (entry,) = store.entries(kind)  # a fresh store holds exactly the one this part made
    return json.loads(store.entry_path(kind, entry["key"]).read_text(encoding="utf-8"))


def label(lm, data: str, args) -> dict:
    import torch

    from pop_analysis.speed.machine import cpu_model

    load = os.getloadavg()[0]
    machine = (f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, "
               f"{str(lm.dtype).replace('torch.', '')}, load {load:.1f} at the start")
    return {"model": lm.name, "data": data, "machine": machine,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": f"python -m pop_analysis examples --model {lm.name} --parts {args.parts}"
                       + (f" --threads {args.threads}" if args.threads else "")}


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
    cached_drift(lm, ids, _skip(lm), DriftConfig(), use_cache=False, progress=terminal_bar)


def _sweep(lm) -> None:
    from pop_analysis.experiments import sweep as sw
    from pop_analysis.progress import terminal_bar

    cfg = sw.SweepConfig(dataset=SWEEP["dataset"], n_samples=SWEEP["samples"],
                         max_new_tokens=SWEEP["new_tokens"], repeats=SWEEP["repeats"])
    sw.cached_sweep(lm, "ratio", cfg, use_cache=False, progress=terminal_bar)


def _generation(lm) -> None:
    from pop_analysis.data.example_prompts import SHORT
    from pop_analysis.engine.generate import SamplingConfig, encode
    from pop_analysis.inspection.side_by_side import cached_generation

    ids = encode(lm, SHORT, raw=_raw(lm))
    settings = {"prompt": SHORT, "variant": "POP", "decoding": "greedy", "new tokens": 32,
                "raw": _raw(lm)}
    cached_generation(lm, SHORT, ids, "pop", _skip(lm), SamplingConfig(max_new_tokens=32),
                      "POP (independent KV + boundary)", "POP", settings, use_cache=False)


def _stepthrough(lm) -> None:
    from pop_analysis.inspection import stepthrough as stp

    ids = stp.encode_short(lm, STEP_PROMPT)
    stp.cached_stepthrough(lm, ids, _skip(lm), stp.StepConfig(), STEP_PROMPT, use_cache=False)


MAKERS = {  # part -> (its data, in words; the maker)
    "calibration": (lambda lm: f"{CALIBRATION['samples']} built-in prompts, responses of up to "
                               f"{CALIBRATION['response_tokens']} sampled tokens", _calibration),
    "drift": (lambda lm: "the long example prompt (a town's history), 8 decode steps, the "
                         "paper's last third skipped", _drift),
    "sweep": (lambda lm: f"ratio sweep, first {SWEEP['samples']} GSM8K test items, "
                         f"{SWEEP['new_tokens']} greedy tokens", _sweep),
    "generation": (lambda lm: "the short example prompt (sky), 32 greedy tokens, the paper's "
                              "last third skipped", _generation),
    "stepthrough": (lambda lm: f"'{STEP_PROMPT}', the paper's last third skipped", _stepthrough),
}
