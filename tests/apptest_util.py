"""Helpers shared by the AppTest-driven dashboard tests."""
import time

from streamlit.testing.v1 import AppTest


def wait_jobs(at: AppTest, timeout: float = 300) -> AppTest:
    """Rerun until the session's background runs have finished and been filed."""
    end = time.time() + timeout
    while at.session_state["lab.jobs"] if "lab.jobs" in at.session_state else False:
        assert time.time() < end, "a background run did not finish"
        time.sleep(0.3)
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at
