"""The engine's parent-death guard, run as a script (`python watchdog.py PARENT_PID CMD...`).

It is started as the leader of a new process group, starts CMD in that group and waits on it. It
ends the whole group (the vLLM front end, its engine core and workers) when the process that
started it is gone (its parent pid changes: the parent exited or was killed, even by SIGKILL,
which no atexit hook sees) or when it is asked to stop (SIGTERM/SIGINT). Standard library only:
it runs under the serving venv's Python and imports nothing from the project.
"""
import os
import signal
import subprocess
import sys

POLL_S = 0.5  # how soon a dead parent is noticed
GRACE_S = 10.0  # the engine's time to shut down cleanly before SIGKILL


def main() -> int:
    parent, cmd = int(sys.argv[1]), sys.argv[2:]
    asked = []
    signal.signal(signal.SIGTERM, lambda *_: asked.append(1))
    signal.signal(signal.SIGINT, lambda *_: asked.append(1))
    child = subprocess.Popen(cmd)  # same process group as this wrapper
    while True:
        try:
            rc = child.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            rc = None
        if rc is not None:  # the engine ended on its own: its helpers must not linger
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.killpg(0, signal.SIGTERM)
            return rc
        if asked or os.getppid() != parent:
            return end_group(child)


def end_group(child) -> int:
    """SIGTERM to the group (this wrapper ignores it), then SIGKILL to whatever is left."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    try:
        child.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    os.killpg(0, signal.SIGKILL)  # the engine's own children too; ends this wrapper as well
    return 0


if __name__ == "__main__":
    sys.exit(main())
