"""Every numeric option of every command, lists included (found by their declared types): NaN, infinity, negative and huge values get one `error:` line and a non-zero exit, no traceback, before any model loads or engine starts, in seconds (a Hypothesis property over each option's declared range, and every bad class exhaustively); a range list (skip sets, core lists) is bounded before it is expanded; sizes beyond the data say how many items it holds, and an honest size within it is allowed."""
import argparse
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pop_analysis import cli
from pop_analysis.commands._common import Num, NumList, RangeList
from pop_analysis.serving.server import Engine

START = Engine.start  # the real one (the module's fixture replaces it while commands run)

# What each command needs besides the option under test.
BASE = {("generate",): ["--prompt", "hi"], ("drift",): ["--prompt", "hi"]}
BAD = {"nan": ["nan", "-NaN"], "inf": ["inf", "-inf", "1e309"], "negative": ["-1", "-0.5"],
       "huge": ["1e30", "1" + "0" * 30]}


class Work(Exception):
    """Raised where a command would load a model or start an engine."""


def commands():
    """(sub-command path, parser) of every command, `repair fit` included."""
    def walk(parser, path=()):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield path, parser
        for a in subs:
            for name, sp in a.choices.items():
                if "_" not in name:  # serve_bench is an alias of serve-bench
                    yield from walk(sp, path + (name,))
    return list(walk(cli.build_parser(cli.command_modules())))


def numeric_options():
    """(command path, flag, type) of every numeric option: a Num, a NumList (comma-separated
    Nums) or a RangeList (numbers and ranges: skip sets, core lists)."""
    return [(path, a.option_strings[0], a.type) for path, parser in commands()
            for a in parser._actions if isinstance(a.type, (Num, NumList, RangeList))]


OPTIONS = numeric_options()
LISTS = {flag for _, flag, kind in OPTIONS if isinstance(kind, (NumList, RangeList))}


def single(kind):
    """The check one value of the option passes (a list of one number is that number)."""
    return kind.each if isinstance(kind, NumList) else kind


@pytest.fixture(scope="module")
def no_work(tmp_path_factory):
    """Model loads and engine starts raise Work; the report writes under a temporary folder."""
    import pop_analysis.commands._common as common
    import pop_analysis.engine.models as models
    mp = pytest.MonkeyPatch()
    parser = cli.build_parser(cli.command_modules())
    mp.setattr(cli, "build_parser", lambda mods: parser)  # built once: the calls only parse
    for where in (common, models):
        mp.setattr(where, "load_model", lambda *a, **k: (_ for _ in ()).throw(Work("work began")))
    mp.setattr(Engine, "start", lambda *a, **k: (_ for _ in ()).throw(Work("work began")))
    from pop_analysis.store.paths import cache_dir

    store = tmp_path_factory.mktemp("cache")  # results go here; the converted models are shared
    (store / "models").symlink_to((cache_dir() / "models").resolve(), target_is_directory=True)
    mp.setenv("POP_LAB_CACHE", str(store))
    yield tmp_path_factory.mktemp("out") / "report.md"
    mp.undo()


def run(argv, capsys) -> tuple[int, list[str], float]:
    capsys.readouterr()
    t0 = time.perf_counter()
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse refuses a flag's value
        code = e.code
    err = capsys.readouterr().err
    return code, [ln for ln in err.splitlines() if ln.strip()], time.perf_counter() - t0


def argv_for(path, flag, value, report_out) -> list[str]:
    extra = ["--out", str(report_out)] if path == ("report",) else []
    return [*path, *BASE.get(path, []), *extra, f"{flag}={value}"]


def refused(path, flag, value, no_work, capsys) -> str:
    code, lines, seconds = run(argv_for(path, flag, value, no_work), capsys)
    where = f"{' '.join(path)} {flag}={value[:20]}"
    assert code != 0 and len(lines) == 1 and lines[0].startswith("error: "), (where, code, lines)
    assert "Traceback" not in lines[0] and "work began" not in lines[0], (where, lines)
    assert seconds < 30, (where, seconds)
    return lines[0]


def test_every_numeric_option_is_a_checked_number():
    """No plain int or float option is left: each is a Num (finite, bounded) or a checked list."""
    plain = [(p, a.option_strings) for p, parser in commands() for a in parser._actions
             if a.type in (int, float)]
    assert plain == []
    assert len(OPTIONS) >= 50 and "--start-timeout" in {f for _, f, _ in OPTIONS}
    assert LISTS >= {"--lengths", "--ratios", "--request-rates", "--budgets", "--prompt-ids",
                     "--skip", "--prefill-cpus", "--decode-cpus"}, LISTS


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_values_of_every_numeric_option_are_one_line(kind, no_work, capsys):
    for path, flag, num in OPTIONS:
        for value in BAD[kind]:
            if isinstance(num, NumList) and num.inf_ok and value == "inf":
                continue  # a request rate of inf: all at once, not an error
            refused(path, flag, value, no_work, capsys)


def as_text(x) -> str:
    return repr(x) if isinstance(x, float) else str(x)


NUMBERS = (st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10 ** 40, 10 ** 40)
           | st.sampled_from([0, 1, 2, 3, 16, 4096, 65535, 86400, 2 ** 63 - 1, 2 ** 63]))


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(OPTIONS), number=NUMBERS)
def test_any_number_is_refused_unless_in_range(option, number, no_work, capsys):
    """Out of the option's declared range: one line before any work. In range: the command goes
    on (to the model load, or a check that needs the data) and still ends in one line."""
    path, flag, kind = option
    text = as_text(number)
    try:
        if not (isinstance(kind, NumList) and kind.inf_ok and number == float("inf")):
            single(kind)(text)
    except argparse.ArgumentTypeError:
        refused(path, flag, text, no_work, capsys)
        return
    code, lines, _ = run(argv_for(path, flag, text, no_work), capsys)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in lines[0]


HUGE_RANGES = ["0-999999999999", "0-9,5-" + "9" * 5000, ",".join(["0-3"] * 50) + ",0-10000000"]


@pytest.mark.parametrize("text", HUGE_RANGES)
def test_every_range_list_is_bounded_before_it_is_expanded(text, no_work, capsys):
    """A range of 10^12 (or a 5000-digit end) in any range-list option: one short line at once,
    no list built (a 10^12-number list would fill the machine; this stays under 4 MiB)."""
    ranges = [(p, f) for p, f, kind in OPTIONS if isinstance(kind, RangeList)]
    assert ranges
    for path, flag in ranges:
        tracemalloc.start()
        line = refused(path, flag, text, no_work, capsys)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert "out of range" in line and len(line) < 300 and peak < 4 << 20, (path, flag, line)


def test_serve_disaggregated_refuses_a_core_range_of_a_trillion_at_once(no_work, capsys):
    code, lines, seconds = run(["serve", "--disaggregated", "--prefill-cpus", "0-999999999999"],
                               capsys)
    assert code == 2 and len(lines) == 1 and seconds < 5, (code, lines, seconds)
    assert "argument --prefill-cpus: core(s) in '0-999999999999' out of range: this machine " \
           "has cores 0.." in lines[0], lines


@pytest.mark.parametrize("argv, why", [
    (["report", "--n", "99999999999"], "gsm8k holds 1319 items, fewer than the 99999999999 "
                                      "asked for by --n; ask for at most 1319"),
    (["report", "--parts", "length", "--length-n", "999999999"],
     "the retrieval task holds 1296000 items, fewer than the 999999999 asked for by --length-n"),
    (["report", "--parts", "mc", "--mc-n", "1320"], "gsm8k holds 1319 items"),
    (["sweep", "--samples", "1320"], "gsm8k holds 1319 items, fewer than the 1320"),
    (["sweep", "--dataset", "wizardlm", "--samples", "219"], "wizardlm holds 218 items"),
    (["calibrate", "--samples", "106"], "builtin holds 105 prompts, fewer than the 106 asked for"),
    (["repair", "fit", "--samples", "106"], "builtin holds 105 prompts"),
    (["repair", "fit", "--answers", "--data", "gsm8k_train", "--samples", "7474"],
     "gsm8k_train holds 7473 items"),
    (["drift", "--dataset", "builtin", "--samples", "106"], "builtin holds 105 prompts"),
])
def test_sizes_beyond_the_data_say_how_many_items_it_holds(argv, why, no_work, capsys):
    if argv[0] == "report":
        argv = [*argv, "--out", str(no_work)]
    code, lines, _ = run(argv, capsys)
    assert code == 1 and len(lines) == 1 and why in lines[0], lines


@pytest.mark.parametrize("argv", [
    ["report", "--n", "1319", "--mc-n", "1319", "--length-n", "1296000"],
    ["sweep", "--samples", "1319"],
    ["sweep", "--kind", "length", "--samples", "1296000"],
    ["calibrate", "--samples", "105"],
    ["repair", "fit", "--answers", "--data", "gsm8k_train", "--samples", "7473"],
])
def test_an_honest_long_run_within_the_data_goes_on_to_the_model(argv, no_work, capsys):
    if argv[0] == "report":
        argv = [*argv, "--out", str(no_work)]
    code, lines, _ = run(argv, capsys)
    assert code == 1 and lines == ["error: work began"], lines


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 0.0, -1.0, 1e30])
def test_an_engine_start_that_would_never_time_out_is_refused(tmp_path, monkeypatch, timeout):
    """The library's own guard under the CLI's flag check (the dashboard calls it directly)."""
    import subprocess

    from pop_analysis.serving.server import EngineSpec
    from pop_analysis.serving.venv import ServingError

    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("an engine started"))
    with pytest.raises(ServingError, match=r"start timeout must be a number of seconds in "
                                           r"\(0, 86400\], got"):
        START(Engine(EngineSpec(model_dir=str(tmp_path), name="x")), timeout_s=timeout)
