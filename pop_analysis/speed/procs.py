"""Processes as /proc shows them (Linux): stat fields, children, descendants, CPU time, memory.

Standard library only: the serving venv imports it through speed/timing.py as well.
"""
from __future__ import annotations

import os
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after "pid (comm) ": [state, ppid, pgrp, ...]; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()  # comm may hold spaces and parentheses


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def pids() -> list[int]:
    """Every live process id (none off Linux)."""
    return [int(n) for n in os.listdir("/proc") if n.isdigit()] if os.path.isdir("/proc") else []


def _children_of() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pid in pids():
        fields = stat_fields(pid)
        if fields is not None:
            out.setdefault(int(fields[1]), []).append(pid)
    return out


def children(pid: int) -> list[int]:
    """Live processes whose parent is `pid`."""
    return _children_of().get(pid, [])


def descendants(root: int | None = None) -> list[int]:
    """Live processes started (directly or not) by `root` (default: this process)."""
    kids = _children_of()
    out, todo = [], [os.getpid() if root is None else root]
    while todo:
        found = kids.get(todo.pop(), [])
        out += found
        todo += found
    return out


def cpu_seconds(pids_) -> float:
    """CPU seconds (user + system, children waited for included) of these live processes."""
    total = 0
    for pid in pids_:
        fields = stat_fields(pid)
        if fields is not None:
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")
