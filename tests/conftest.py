import os
import sys
from pathlib import Path

# OpenMP threads busy-wait by default; beside a test's own server process on 2 cores that
# slows every forward several-fold. Tests measure no speed, so let idle threads sleep.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
SHARED_DATA = ROOT.parent / "shared" / "data"

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


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


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data sets not found at {SHARED_DATA}")
    return SHARED_DATA
