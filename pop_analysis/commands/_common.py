"""Arguments and helpers shared by several commands."""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

from pop_analysis.engine.models import DEFAULT_MODEL, load_model
from pop_analysis.engine.skipset import MAX_LAYERS, resolve
from pop_analysis.errors import InputError, shown
from pop_vllm.ranges import RangeError, parse_ranges
from pop_vllm.run_setting import RunSetting

# Upper bounds of the numeric options: far beyond any honest run, short of runs that never end.
MAX_TOKENS = 1 << 24  # tokens in a prompt or an answer: beyond any model's context (16.7M)
MAX_WAIT_S = 86400.0  # seconds any command waits at most (a day)
MAX_SEED = 2 ** 63 - 1  # seeds torch and the samplers take
MAX_COUNT = 2 ** 63 - 1  # sizes checked against the data itself (which says how many it holds)


class Num:
    """An argparse type: one finite number in [low, high] (open_low / open_high: the bound itself
    excluded), parsed as `kind`.
    NaN and infinity are refused (a NaN never compares greater: a timeout of nan never ends),
    and so is an int written as a float ('1e3'); the error is one line naming the bound."""

    def __init__(self, kind: type = int, low=None, high=None, open_low: bool = False,
                 open_high: bool = False, unit: str = ""):
        self.kind, self.low, self.high, self.unit = kind, low, high, unit
        self.open_low, self.open_high = open_low, open_high
        self.__name__ = kind.__name__  # argparse names the type in some messages

    def describe(self) -> str:
        what = ("a whole number" if self.kind is int else "a finite number") + (
            f" of {self.unit}" if self.unit else "")
        if self.low is None and self.high is None:
            return what
        if self.high is None:
            return f"{what} {'>' if self.open_low else '>='} {self.low:g}"
        if self.kind is int:
            return f"{what} in {self.low}..{self.high}"
        return (f"{what} in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}"
                f"{')' if self.open_high else ']'}")

    def __call__(self, text: str):
        value = self._parse(text.strip())
        if value is None or not self._within(value):
            raise argparse.ArgumentTypeError(f"must be {self.describe()}, got {shown(text)}")
        return value

    def _within(self, value) -> bool:
        low = self.low is None or (value > self.low if self.open_low else value >= self.low)
        return low and (self.high is None or (value < self.high if self.open_high
                                              else value <= self.high))

    def _parse(self, text: str):
        if self.kind is int:  # at most 30 digits: int() of a million digits takes seconds
            return int(text) if re.fullmatch(r"[+-]?[0-9]{1,30}", text) else None
        try:
            value = float(text)
        except ValueError:
            return None
        return value if math.isfinite(value) else None


TOKENS = Num(int, 1, MAX_TOKENS)
SEED = Num(int, 0, MAX_SEED)
COUNT = Num(int, 1, MAX_COUNT)  # a size the data checks (it knows how many items it holds)
TEMPERATURE = Num(float, 0.0, 100.0)  # at 100 sampling is uniform already
TOP_P = Num(float, 0.0, 1.0, open_low=True)
RATIO = Num(float, 0.0, 1.0, open_high=True)  # a share of the layers skipped
RATIO_OPEN = Num(float, 0.0, 1.0, open_low=True, open_high=True)  # a share that skips something


def seconds(high: float) -> Num:
    """A positive, finite duration of at most `high` seconds."""
    return Num(float, 0.0, high, open_low=True, unit="seconds")


def add_model_args(p) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"registry name, hub id or local directory (default {DEFAULT_MODEL})")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bf16 on GPU)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a hub model's own code to run (off by default)")
    p.add_argument("--threads", type=Num(int, 1), default=None, help="CPU threads for torch")
    p.add_argument("--json", action="store_true", help="end stdout with one JSON object")


def add_skip_args(p, default_ratio: float | None = None) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--skip", type=LAYER_LIST, default=None,
                   help="explicit 0-indexed layers, e.g. 20-29 or 3,5,7")
    g.add_argument("--skip-ratio", type=RATIO, default=None,
                   help=f"skip the last round(ratio*L) layers (default {default_ratio})")
    g.add_argument("--preset", default=None, help="paper, shallow, interleaved or none")
    p.set_defaults(default_ratio=default_ratio)


INF_WORDS = ("inf", "infinity", "+inf")


class NumList:
    """An argparse type: comma-separated numbers, each one a `each` (a Num, checked as it is read),
    at least one; 'inf' kept where `inf_ok`. Nothing is expanded, so a list is never longer than
    its text."""

    def __init__(self, each: Num, inf_ok: bool = False):
        self.each, self.inf_ok = each, inf_ok
        self.__name__ = f"list of {each.__name__}"

    def __call__(self, text: str) -> list:
        out = []
        for part in (x.strip() for x in text.split(",") if x.strip()):
            if self.inf_ok and part.lower() in INF_WORDS:
                out.append(math.inf)
                continue
            try:
                out.append(self.each(part))
            except argparse.ArgumentTypeError as e:
                raise argparse.ArgumentTypeError(
                    f"each value {e}{' (or inf)' if self.inf_ok else ''}") from None
        if not out:
            raise argparse.ArgumentTypeError(f"holds no numbers, got {shown(text)}")
        return out


class RangeList:
    """An argparse type: numbers and ranges like 0-3,5 (`pop_vllm.ranges`, the reader skip sets
    use too), each number checked against `bound` before a range is expanded -> sorted tuple."""

    def __init__(self, noun: str, bound: int, limit: str | None = None, example: str = "0-3",
                 empty_ok: bool = False):
        self.noun, self.bound, self.limit, self.example = noun, bound, limit, example
        self.empty_ok = empty_ok
        self.__name__ = f"{noun} list"

    def __call__(self, text: str) -> tuple[int, ...]:
        try:
            out = parse_ranges(text, self.bound, self.noun, self.limit, self.example)
        except RangeError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if not out and not self.empty_ok:
            raise argparse.ArgumentTypeError(f"holds no {self.noun}s, got {shown(text)}")
        return out


def core_list() -> RangeList:
    """Cores an engine is pinned to: ids this machine has (which of them this process may use
    is the topology's check)."""
    n = os.cpu_count() or 1
    return RangeList("core", n, f"this machine has cores 0..{n - 1}")


LAYER_LIST = RangeList("layer", MAX_LAYERS, example="20-29", empty_ok=True)


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


def setting_from_args(args, n_layers: int, variant: str = "pop") -> RunSetting:
    """The run setting of --skip / --skip-ratio / --preset and `variant`, checked once."""
    return RunSetting(skip_from_args(args, n_layers), variant).check(n_layers)


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
