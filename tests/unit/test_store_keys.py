"""Store keys name no file outside the store, and a dead run's temporary files are removed on the next save."""
import os

import pytest

from pop_analysis.importance.calibrate import KIND
from pop_analysis.store import results as store


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POP_LAB_CACHE", str(tmp_path))
    return tmp_path


def test_keys_that_are_not_store_keys_name_no_file(cache):
    """A key typed by a user (sweep --calibration KEY) never becomes a path."""
    (cache / "secret.json").write_text('{"payload": {}}')
    for key in ("../../secret", "/etc/passwd", "", "ABC", "0" * 200):
        assert store.load(KIND, key) is None
    with pytest.raises(ValueError, match="not a store key"):
        store.save(KIND, "../escape", {})


def test_stale_temp_files_of_a_dead_run_are_removed_on_the_next_save(cache):
    folder = store.results_dir(KIND)
    folder.mkdir(parents=True)
    stale, fresh = folder / ".aaaa.x1.tmp", folder / ".bbbb.x2.tmp"
    stale.write_text("half an entry from a killed run")
    fresh.write_text("being written right now by another process")
    old = store.RUN_STARTED - store.TMP_GRACE_S - 3600
    os.utime(stale, (old, old))
    store.save(KIND, store.make_key({"a": 1}), {"x": 1})
    assert not stale.exists() and fresh.exists()
