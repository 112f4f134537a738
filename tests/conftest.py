"""Fixtures every tier shares, and the tier marker of each test, taken from its folder
(tests/unit, tests/embedded, tests/dashboard, tests/browser, tests/serving)."""
import json
import os
from pathlib import Path

# OpenMP threads busy-wait by default; beside a test's own server process on 2 cores that
# slows every forward several-fold. Tests measure no speed, so let idle threads sleep.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402

# Property tests check behaviour, not speed: no per-example deadline (hypothesis' default 200 ms
# fails an example that a busy machine merely delayed).
hypothesis_settings.register_profile("pop-lab", deadline=None)
hypothesis_settings.load_profile("pop-lab")

TESTS = Path(__file__).resolve().parent
SHARED_DATA = TESTS.parent.parent / "shared" / "data"
# The tiers, in the order they run when no cost is measured: the longest modules first (engine
# and browser starts), so that the workers of a parallel run (test.sh runs pytest-xdist, a module
# per worker at a time) end together while the many short modules fill the gaps.
TIERS = ("serving", "browser", "dashboard", "embedded", "unit")
# Each module's measured seconds on a fresh clone of the 2-core machine (scripts/module_costs.py
# writes it from a run's JUnit XML): modules run longest first, a module not measured yet at its
# tier's place among them.
COSTS = TESTS / "module_costs.json"

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    tiers = {}
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(TESTS)
        tier = rel.parts[0] if len(rel.parts) > 1 else None
        if tier not in TIERS:
            raise pytest.UsageError(f"tests/{rel}: a test module belongs in one of the tier folders "
                                    f"tests/{{{','.join(TIERS)}}}/")
        item.add_marker(getattr(pytest.mark, tier))
        tiers[item.nodeid] = (tier, rel.as_posix())
    costs = json.loads(COSTS.read_text()) if COSTS.exists() else {}
    unknown = {t: max([c for m, c in costs.items() if m.startswith(f"{t}/")], default=0.0)
               for t in TIERS}  # an unmeasured module: as long as its tier's longest

    def order(item):  # longest first; stable: a module's tests keep their order, modules stay whole
        tier, module = tiers[item.nodeid]
        return -costs.get(module, unknown[tier]), TIERS.index(tier), module

    items.sort(key=order)


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M model, loaded once per test session."""
    from pop_analysis.engine.models import load_model

    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def gemma():
    """The embedded Gemma-3-270M model (base, de-quantised from Q4_K_M), loaded once per session."""
    from pop_analysis.engine.models import load_model

    return load_model("gemma3-270m", device="cpu")


SECRET = {"aws_access_key_id": "AKIA-not-real", "aws_secret_access_key": "not-real-either"}


@pytest.fixture()
def allowed_cache(tmp_path, monkeypatch):
    """An empty results store (the converted models linked in) as the only cache, with no extra
    allowed folders: the path rule as a fresh user meets it."""
    from pop_analysis.data.allowed_paths import ENV
    from pop_analysis.store.paths import cache_dir

    models = cache_dir() / "models"
    store = tmp_path / "cache"
    store.mkdir()
    (store / "models").symlink_to(models.resolve(), target_is_directory=True)
    monkeypatch.setenv("POP_LAB_CACHE", str(store))
    monkeypatch.delenv(ENV, raising=False)
    return store


@pytest.fixture()
def outside_folder(tmp_path):
    """A folder that is none of the allowed ones (the tests run from the repository), holding
    files with secrets in them."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    (d / "secrets.json").write_text(json.dumps([SECRET]))
    (d / "secrets.csv").write_text(",".join(SECRET) + "\n" + ",".join(SECRET.values()) + "\n")
    return d


@pytest.fixture
def tmp_results(tmp_path, monkeypatch):
    """The results store's folders under tmp_path (the converted models stay where they are)."""
    from pop_analysis.store import results as store

    monkeypatch.setattr(store, "results_dir", lambda kind: tmp_path / kind)
    return tmp_path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data sets not found at {SHARED_DATA}")
    return SHARED_DATA
