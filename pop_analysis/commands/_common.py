"""Arguments and helpers shared by several commands."""
from __future__ import annotations

import json
import os
import sys

from pop_analysis.engine.models import DEFAULT_MODEL, load_model
from pop_analysis.engine.skipset import resolve
from pop_analysis.errors import InputError, shown


def add_model_args(p) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"registry name, hub id or local directory (default {DEFAULT_MODEL})")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bf16 on GPU)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a hub model's own code to run (off by default)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument("--json", action="store_true", help="end stdout with one JSON object")


def add_skip_args(p, default_ratio: float | None = None) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--skip", default=None, help="explicit 0-indexed layers, e.g. 20-29 or 3,5,7")
    g.add_argument("--skip-ratio", type=float, default=None,
                   help=f"skip the last round(ratio*L) layers (default {default_ratio})")
    g.add_argument("--preset", default=None, help="paper, shallow, interleaved or none")
    p.set_defaults(default_ratio=default_ratio)


def int_list(text: str, flag: str, minimum: int = 0) -> list[int]:
    """'1, 2,3' -> [1, 2, 3]: plain decimal integers >= minimum; an empty list is refused."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not all(x.isascii() and x.isdigit() for x in parts):
        raise InputError(f"{flag} must be comma-separated integers, got {shown(text)}")
    if not parts:
        raise InputError(f"{flag} holds no numbers, got {shown(text)}")
    if any(len(x) > 12 for x in parts):
        raise InputError(f"{flag}: {shown(max(parts, key=len))} is too large")
    values = [int(x) for x in parts]
    if min(values) < minimum:
        raise InputError(f"{flag} needs integers >= {minimum}, got {shown(text)}")
    return values


def set_threads(args) -> int:
    import torch

    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads must be at least 1, got {args.threads}")
    cores = usable_cores()
    if args.threads is not None and args.threads > cores:  # torch would try to start them all
        raise InputError(f"--threads {args.threads} is more than the {cores} CPU cores this "
                         f"process may use; give 1..{cores}")
    if args.threads:
        torch.set_num_threads(args.threads)
    return torch.get_num_threads()


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def writable(path: str, flag: str, make_parent: bool = False) -> str:
    """Refuse, before any work, an output path that cannot be written (a missing folder, a
    file where a folder should be, no permission); no file is left behind. make_parent: create
    the folder first, as the writer itself would."""
    existed = os.path.exists(path)
    try:
        if make_parent:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a"):
            pass
        if not existed:
            os.unlink(path)
    except OSError as e:
        raise InputError(f"{flag} {shown(path, 200)}: cannot write there "
                         f"({e.strerror or type(e).__name__})") from None
    return path


def load(args):
    set_threads(args)
    return load_model(args.model, device=args.device, dtype=args.dtype,
                      trust_remote_code=args.trust_remote_code)


def skip_from_args(args, n_layers: int) -> tuple[int, ...]:
    ratio = args.skip_ratio
    if args.skip is None and ratio is None and args.preset is None:
        ratio = args.default_ratio
    return resolve(n_layers, layers=args.skip, ratio=ratio, preset_name=args.preset)


def emit_json(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def quiet_hf() -> None:
    """Keep transformers' progress bars off the CLI's stdout/stderr."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging

        logging.disable_progress_bar()
        logging.set_verbosity_error()
    except Exception:  # noqa: BLE001
        pass
