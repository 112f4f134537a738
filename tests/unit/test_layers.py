"""The code's layering, read from its own imports: imports go down, never up, and never round.

Fast and model-free: every module under pop_analysis/, pop_vllm/, dashboard/ and pages/ is parsed
with ast, lazy imports inside functions included, and each import is resolved to the module it
names. From the bottom up:
- the plugin's pure modules (pop_vllm: variants, plan, settings, ...): facts both sides share;
- the library's layers (pop_analysis/), each importing only its own layer and those below;
- the dashboard's rooms: charts (pure plotly), session plumbing, panels, then app.py and pages/.
The plugin's engine modules import vLLM; they sit beside the library, which never imports them.
"""
import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_PURE = {"pop_vllm", "pop_vllm.variants", "pop_vllm.plan", "pop_vllm.settings",
               "pop_vllm.run_setting", "pop_vllm.healing", "pop_vllm.precision", "pop_vllm.errors",
               "pop_vllm.engine_env", "pop_vllm.stats", "pop_vllm.kv_keys", "pop_vllm.ranges",
               "pop_vllm.patches"}
# From the bottom up; a module may import its own layer and the ones below it.
LAYERS = [
    PLUGIN_PURE,
    {"pop_analysis", "pop_analysis.errors", "pop_analysis.progress"},
    {"store"}, {"engine"}, {"data"}, {"speed"}, {"serving"}, {"importance"}, {"inspection"}, {"quality"},
    {"repair"}, {"harness"}, {"experiments"}, {"commands"},
    {"pop_analysis.cli", "pop_analysis.__main__"},
]
LIBRARY_LAYERS = {next(iter(m)) for m in LAYERS[2:-1]}  # store, engine, data, ...
PLUGIN_ENGINE = len(LAYERS)  # pop_vllm's vLLM-importing modules: above the pure ones, beside the library
UI = {"dashboard.charts": 1, "dashboard.session": 2, "dashboard.panels": 3, "dashboard": 4, "pages": 5}
FOREIGN = ("streamlit", "vllm", "dashboard", "pages")  # the library never imports these
PURE_FOREIGN = ("vllm", "torch", "pop_analysis", "dashboard", "streamlit")  # nor do the plugin's pure modules


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources(top: str, base: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, base): p for p in (ROOT / top).rglob("*.py")}


ALL = {**sources("pop_analysis"), **sources("pop_vllm/pop_vllm", ROOT / "pop_vllm"),
       **sources("dashboard"), **sources("pages")}


def resolve(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str) -> set[str]:
    """Every module `name` imports (the deepest known module each import statement names)."""
    path = ALL[name]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mod = resolve(node, name, path.name == "__init__.py")
            subs = {f"{mod}.{a.name}" for a in node.names} & ALL.keys()
            out |= subs or {mod}
    return {m for m in out if m != name}


def known(mod: str) -> str | None:
    """The project module an import names (its longest known prefix), or None for a foreign one."""
    parts = mod.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in ALL:
            return ".".join(parts[:i])
    return None


def layer(name: str) -> float:
    top = name.split(".")[0]
    if top in ("dashboard", "pages"):
        room = ".".join(name.split(".")[:2])
        return len(LAYERS) + UI.get(room, UI[top])
    for i, members in enumerate(LAYERS):
        if name in members or (top == "pop_analysis" and name.split(".")[1:2] and name.split(".")[1] in members):
            return i
    if top == "pop_vllm":
        return PLUGIN_ENGINE
    raise AssertionError(f"{name} belongs to no layer: add its package to LAYERS in {__file__}")


GRAPH = {name: {k for m in imports(name) if (k := known(m))} for name in ALL}


def test_every_module_has_a_layer():
    for name in ALL:
        layer(name)


def test_no_upward_import():
    bad = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
           for a, deps in GRAPH.items() for b in deps if layer(b) > layer(a)]
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def test_no_import_cycle():
    try:
        tuple(graphlib.TopologicalSorter(GRAPH).static_order())
    except graphlib.CycleError as e:
        pytest.fail("import cycle: " + " -> ".join(e.args[1]))


def test_the_library_never_imports_the_ui_or_the_serving_engine():
    bad = [f"{a} imports {m}" for a in ALL if a.startswith("pop_analysis")
           for m in imports(a) if m.split(".")[0] in FOREIGN
           or (m.startswith("pop_vllm") and known(m) not in PLUGIN_PURE)]
    assert not bad, "\n".join(bad)


def test_the_plugins_pure_modules_import_neither_vllm_nor_torch():
    bad = [f"{a} imports {m}" for a in PLUGIN_PURE for m in imports(a)
           if m.split(".")[0] in PURE_FOREIGN or (m.startswith("pop_vllm") and known(m) not in PLUGIN_PURE)]
    assert not bad, "\n".join(bad)


def test_charts_are_pure_plotly():
    bad = [f"{a} imports {m}" for a in ALL if a.startswith("dashboard.charts")
           for m in imports(a) if m.split(".")[0] in ("streamlit", "torch")]
    assert not bad, "\n".join(bad)


def test_every_dashboard_module_lives_in_a_room():
    loose = [n for n in ALL if n.startswith("dashboard.") and n != "dashboard.app"
             and n.split(".")[1] not in ("charts", "session", "panels")]
    assert not loose, f"put these in dashboard/charts, session or panels: {loose}"


def test_no_dashboard_module_shares_a_name_with_a_library_layer():
    clash = [n for n in ALL if n.split(".")[0] in ("dashboard", "pages")
             and n.split(".")[-1] in LIBRARY_LAYERS]
    assert not clash, clash


def test_no_module_edits_sys_path():
    edits = [str(p.relative_to(ROOT)) for p in [*ALL.values(), *ROOT.glob("tests/**/*.py"),
                                                  *ROOT.glob("bench/*.py")]
             if p.name != "test_layers.py" and any(f"sys.path.{verb}(" in p.read_text()
                                                    for verb in ("insert", "append"))]
    assert not edits, f"installed packages are found by name (scripts/install.sh): {edits}"


def test_no_module_over_400_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in ALL.items()}
    assert not {n: k for n, k in long.items() if k > 400}


def test_page_files_at_most_150_lines():
    long = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "pages").glob("*.py")}
    assert not {n: k for n, k in long.items() if k > 150}, long


def test_the_check_itself_sees_an_upward_import_and_a_cycle():
    """The checks above can fail: a fake upward edge and a fake cycle are caught."""
    fake = {**GRAPH, "pop_analysis.store.paths": GRAPH["pop_analysis.store.paths"] | {"pop_analysis.engine.pop"}}
    assert layer("pop_analysis.engine.pop") > layer("pop_analysis.store.paths")
    assert layer("dashboard.panels.widgets") > layer("dashboard.session.state") > layer("dashboard.charts.style")
    assert layer("pop_vllm.models") > layer("pop_vllm.plan")
    with pytest.raises(graphlib.CycleError):
        fake["pop_analysis.engine.pop"] = fake["pop_analysis.engine.pop"] | {"pop_analysis.store.paths"}
        tuple(graphlib.TopologicalSorter(fake).static_order())


# The run setting (pop_vllm/run_setting.py) is the one home of a skip set with its variant.
SETTING_MODULE = "pop_vllm.run_setting"
SKIP_NAMES = {"skip", "skip_layers", "layers"}
VARIANT_NAMES = {"variant", "variants", "engine", "mode"}
# Ways in whose caller fixes the argument names: each builds a RunSetting from them at once.
PAIR_EXEMPT = {
    ("pop_analysis.harness.lm_eval_model", "__init__"): "lm-eval passes model_args as keywords",
}


def skip_variant_pairs(tree: ast.AST) -> list[str]:
    out = []
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = {a.arg for a in f.args.args + f.args.kwonlyargs}
            if names & SKIP_NAMES and names & VARIANT_NAMES:
                out.append(f.name)
    return out


def test_no_function_takes_a_bare_skip_set_and_a_variant_together():
    bad = [f"{name}.{fn}" for name, path in ALL.items() if name != SETTING_MODULE
           for fn in skip_variant_pairs(ast.parse(path.read_text()))
           if (name, fn) not in PAIR_EXEMPT]
    assert not bad, ("take one RunSetting (pop_vllm/run_setting.py) instead of a skip set and a "
                     f"variant: {bad}")


def test_the_pair_check_itself_sees_a_pair():
    assert skip_variant_pairs(ast.parse("def f(lm, variant, skip=()):\n    pass")) == ["f"]
    assert skip_variant_pairs(ast.parse("def f(lm, setting):\n    pass")) == []


# The refusals only the one validator writes (RunSetting.check and its helpers).
VALIDATOR_LINES = ("cannot skip all", "out of range: the model has", "numbered from 0")


def test_one_validator_writes_the_skip_set_refusals():
    bad = [f"{name}: {line!r}" for name, path in ALL.items() if name != SETTING_MODULE
           for line in VALIDATOR_LINES if line in path.read_text()]
    assert not bad, f"a second validator: {bad}"


def test_hooks_are_registered_through_one_helper():
    """engine/hooks.Hooks removes what it registers when its block ends; a hook registered by
    hand could outlive its run on the shared model."""
    bad = [name for name, path in ALL.items() if name != "pop_analysis.engine.hooks"
           and name.startswith(("pop_analysis", "dashboard", "pages"))
           and ("register_forward_hook(" in path.read_text()
                or "register_forward_pre_hook(" in path.read_text())]
    assert not bad, f"use pop_analysis.engine.hooks.Hooks: {bad}"
