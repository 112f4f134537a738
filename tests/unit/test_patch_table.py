"""The plugin's one patch table (pop_vllm/patches.py): every vLLM attribute the plugin replaces
or adds is a row of it, each row resolves, and no other module assigns to vLLM's objects; the
worker-method and vLLM environment names are written only in the plugin's pure modules."""
import ast
import importlib
from pathlib import Path

from pop_vllm.engine_env import CONTROL_METHODS
from pop_vllm.patches import PATCHES

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "pop_vllm" / "pop_vllm"


def test_every_row_names_a_builder_in_the_plugin_and_says_why():
    seen = set()
    for p in PATCHES:
        module, _, name = p.builder.partition(":")
        builder = getattr(importlib.import_module(f"pop_vllm.{module}"), name)
        assert callable(builder), p
        assert p.owner.startswith("vllm.") and p.why, p
        assert (p.owner, p.attribute) not in seen, f"{p.owner}.{p.attribute} patched twice"
        seen.add((p.owner, p.attribute))
    added = {p.attribute for p in PATCHES if p.added}
    assert added == set(CONTROL_METHODS)


def _vllm_names(tree: ast.Module) -> set[str]:
    """Names bound in a module (lazy imports included) to something imported from vLLM."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name.startswith("vllm")}
    return names


def assignments_to_vllm(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    vllm = _vllm_names(tree)
    bad = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AugAssign) else [])
        for t in targets:
            base = t
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(t, ast.Attribute) and isinstance(base, ast.Name) and base.id in vllm:
                bad.append(f"{path.name}:{node.lineno} assigns {ast.unparse(t)}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "setattr" and isinstance(node.args[0], ast.Name)
                and node.args[0].id in vllm):
            bad.append(f"{path.name}:{node.lineno} setattr on {node.args[0].id}")
    return bad


def test_only_the_installer_assigns_to_vllm_objects():
    bad = [b for p in sorted(PLUGIN.glob("*.py")) if p.name != "patching.py"
           for b in assignments_to_vllm(p)]
    assert not bad, bad


def test_the_assignment_check_itself_sees_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from vllm.x import Y\n    Y.z = 1\n    setattr(Y, 'w', 2)\n")
    assert len(assignments_to_vllm(f)) == 2


def _literals(path: Path):
    """String constants, but not a dict's keys (an output field may share a method's name)."""
    tree = ast.parse(path.read_text())
    keys = {id(k) for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in keys:
            yield node.lineno, node.value


def test_method_and_environment_names_live_in_the_plugins_pure_modules():
    """A worker method's name or a VLLM_* variable is written once, in pop_vllm.engine_env; the
    library, the dashboard, the benches and the plugin's other modules import it."""
    files = [p for top in ("pop_analysis", "dashboard", "pages", "bench", "scripts")
             for p in (ROOT / top).rglob("*.py")]
    files += [p for p in PLUGIN.glob("*.py") if p.name not in ("engine_env.py",)]
    bad = [f"{p.relative_to(ROOT)}:{line} {value!r}" for p in files for line, value in _literals(p)
           if value in CONTROL_METHODS or (value.startswith("VLLM_") and value.isupper())]
    assert not bad, bad
