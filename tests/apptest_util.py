"""Helpers shared by the AppTest-driven dashboard tests: a temporary results store, the app, page
switches, element texts, waiting for background runs."""
import os
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "dashboard" / "app.py")


def wait_jobs(at: AppTest, timeout: float = 300) -> AppTest:
    """Rerun until the session's background runs have finished and been filed."""
    end = time.time() + timeout
    while at.session_state["lab.jobs"] if "lab.jobs" in at.session_state else False:
        assert time.time() < end, "a background run did not finish"
        time.sleep(0.3)
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture(scope="module", autouse=True)
def temp_store(tmp_path_factory, embedded):
    """POP_LAB_CACHE -> a temp dir whose models/ points at the converted models."""
    from pop_analysis.store.paths import cache_dir

    models = cache_dir() / "models"  # converted by the `embedded` fixture
    tmp = tmp_path_factory.mktemp("poplab_cache")
    (tmp / "models").symlink_to(models, target_is_directory=True)
    old = os.environ.get("POP_LAB_CACHE")
    os.environ["POP_LAB_CACHE"] = str(tmp)
    yield tmp
    if old is None:
        os.environ.pop("POP_LAB_CACHE", None)
    else:
        os.environ["POP_LAB_CACHE"] = old


def app() -> AppTest:
    return AppTest.from_file(APP, default_timeout=300).run()


def goto(at: AppTest, page: str) -> AppTest:
    at.switch_page(f"../pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def charts(at: AppTest) -> list:
    return at.get("plotly_chart")


def notes(at: AppTest) -> str:
    return texts(list(at.success) + list(at.warning) + list(at.error) + list(at.info))


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)
