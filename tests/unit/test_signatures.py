"""Long parameter lists, read from the code: a function takes at most 7 parameters.

Eight or more loose arguments usually mean that values which travel together (a run setting, a
timing config, one step's token split) were never given a name. Every .py file of the library,
the plugin, the dashboard, the benches and the scripts is parsed with ast; each function's
parameters are counted (positional, keyword-only, *args and **kwargs one each; self and cls
not). The few that keep 8 or more are listed in ALLOWED, each with the reason, and the list is
checked both ways: nothing new above the limit, nothing listed that is no longer there.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = {"pop_analysis": ROOT, "pop_vllm/pop_vllm": ROOT / "pop_vllm", "dashboard": ROOT,
        "pages": ROOT, "bench": ROOT, "scripts": ROOT}  # folder -> what module names start from
LIMIT = 8  # a function with this many parameters or more needs a reason below
MOST_ALLOWED = 8

# "module:qualname" -> why its parameters stay loose (one line each).
ALLOWED = {
    "pop_analysis.harness.lm_eval_model:PopLM.__init__":
        "lm-eval builds the model from --model_args keywords: each parameter is a documented option",
    "pop_analysis.experiments.sweep:cached_sweep":
        "a results-store entry: cache use, progress, notices and compute-on-miss are each "
        "caller's own choice, as in the other cached_* entries",
    "pop_analysis.inspection.stepthrough:cached_stepthrough":
        "a results-store entry: the prompt text and ids, then cache use, notices and progress",
    "pop_analysis.inspection.drift_length:cached_drift_by_length":
        "a results-store entry: the text source, then cache use, progress and notices",
    "pop_analysis.speed.quiet:wait_quiet":
        "the probe, clock and sleep are injected so tests run the waiting loop without waiting",
    "pop_analysis.serving.disagg:plan":
        "each is a flag of serve --disaggregated: decode side, each instance's cores, block size, "
        "KV folder, proxy port and the prefill's int8 layers",
    "pop_analysis.experiments.item_losses:compute_table":
        "a resumable script's job: model, items, sets, file, its labels, chunk size and log",
}


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def n_params(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> int:
    a = fn.args
    positional = [p.arg for p in a.posonlyargs + a.args]
    n = len(positional) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return n - (method and bool(positional) and positional[0] in ("self", "cls"))


def functions(tree: ast.AST, prefix: str = "", method: bool = False):
    """(qualname, parameter count) of every function, nested ones and methods included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, n_params(node, method)
            yield from functions(node, f"{prefix}{node.name}.<locals>.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.", True)
        else:
            yield from functions(node, prefix, method)


def counts() -> dict[str, int]:
    out = {}
    for top, base in TOPS.items():
        for path in sorted((ROOT / top).rglob("*.py")):
            mod = module_name(path, base)
            for qualname, n in functions(ast.parse(path.read_text(), str(path))):
                out[f"{mod}:{qualname}"] = n
    return out


COUNTS = counts()


def test_the_scan_sees_the_code():
    assert COUNTS["pop_analysis.engine.pop:run_prompt"] == 6
    assert "pop_vllm.run_setting:RunSetting.check" in COUNTS, "methods are named by their class"


def test_no_function_takes_eight_parameters_without_a_reason():
    long = {name: n for name, n in COUNTS.items() if n >= LIMIT and name not in ALLOWED}
    assert not long, ("group parameters that travel together (a frozen dataclass) or list the "
                      f"function in ALLOWED with its reason: {long}")


def test_the_allowlist_is_short_and_true():
    assert len(ALLOWED) <= MOST_ALLOWED
    assert all(reason.strip() for reason in ALLOWED.values())
    gone = [name for name in ALLOWED if name not in COUNTS]
    assert not gone, f"listed but no longer in the code: {gone}"
    short = {name: COUNTS[name] for name in ALLOWED if COUNTS[name] < LIMIT}
    assert not short, f"listed but now under {LIMIT} parameters: drop them from ALLOWED: {short}"
