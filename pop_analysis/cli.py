"""`python -m pop_analysis <command>`: the same engine as the dashboard, from a terminal.

Each command lives in pop_analysis/commands/<name>.py with `add_arguments(parser)` and
`run(args) -> int`; this module finds them, parses, and turns errors into one readable line.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import warnings

from pop_analysis import commands
from pop_analysis.errors import first_line
from pop_analysis.progress import end_line
from pop_analysis.store.results import StoreWarning


def command_modules() -> dict:
    mods = {}
    for info in pkgutil.iter_modules(commands.__path__):
        if not info.name.startswith("_"):
            mods[info.name] = importlib.import_module(f"{commands.__name__}.{info.name}")
    return mods


class Parser(argparse.ArgumentParser):
    """argparse held to the CLI's contract: a bad flag is one `error:` line, exit code 2 (argparse
    itself prints the whole usage first). Sub-commands' parsers are of this class too."""

    def error(self, message: str):
        text = " ".join(message.split())
        self.exit(2, f"error: {text} (see {self.prog} --help)\n")


def build_parser(mods: dict) -> argparse.ArgumentParser:
    parser = Parser(prog="python -m pop_analysis",
                    description="POP Lab: prefill-only pruning analysis")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, mod in sorted(mods.items()):
        # serve_bench.py answers to `serve-bench` (and to its module name)
        dashed = name.replace("_", "-")
        p = sub.add_parser(dashed, aliases=[name] if dashed != name else [],
                           help=(mod.__doc__ or "").strip().splitlines()[0])
        p.set_defaults(command_module=name)
        mod.add_arguments(p)
    return parser


def main(argv=None) -> int:
    mods = command_modules()
    args = build_parser(mods).parse_args(argv)
    with warnings.catch_warnings():  # restores the warning display on the way out
        warnings.simplefilter("always", StoreWarning)
        warnings.showwarning = _one_line(warnings.showwarning)
        return _run(mods, args)


def _one_line(show):
    """The project's cache notices as one `warning:` line on stderr; other warnings as before."""
    def showwarning(message, category, *rest, **kw):
        if issubclass(category, StoreWarning):
            end_line()
            print(f"warning: {message}", file=sys.stderr)
        else:
            show(message, category, *rest, **kw)
    return showwarning


def _run(mods, args) -> int:
    try:
        return int(mods[args.command_module].run(args) or 0)
    except KeyboardInterrupt:
        end_line()
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the CLI's contract: one readable line, non-zero exit
        end_line()
        print(f"error: {first_line(e)}", file=sys.stderr)
        return 1
