"""Which local files a dashboard user may name: a path typed into a page (a data set, a model
directory) may not read, or even probe, files elsewhere on the machine.

Allowed are files under the working directory, the cache (cache/ or $POP_LAB_CACHE), the shared
data sets (../shared/data or $POP_LAB_DATA), and directories listed in $POP_LAB_ALLOWED_DIRS
(separated by os.pathsep, ':' on Linux). The path is resolved first (symlinks followed, '..'
folded), so a link inside an allowed folder that points elsewhere is refused; hidden files and
folders (.env, .aws, .ssh) are refused everywhere. The refusal reads the same whether or not the
file exists.
"""
from __future__ import annotations

import os
from pathlib import Path

from pop_analysis.data.readers import DatasetError
from pop_analysis.errors import shown
from pop_analysis.store.paths import cache_dir, shared_data_dir

ENV = "POP_LAB_ALLOWED_DIRS"


class PathNotAllowed(DatasetError):
    """A local path outside the folders the dashboard may read."""


def allowed_roots() -> list[Path]:
    """The folders (resolved) whose files may be read."""
    extra = [Path(p).expanduser() for p in os.environ.get(ENV, "").split(os.pathsep) if p.strip()]
    return [p.resolve() for p in (Path.cwd(), cache_dir(), shared_data_dir(), *extra)]


def check_path(text: str | Path) -> Path:
    """The resolved path when it lies inside an allowed folder; PathNotAllowed otherwise."""
    try:
        path = Path(text).expanduser().resolve()  # relative to the working directory
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
        path = None
    for root in allowed_roots() if path is not None else ():
        if path.is_relative_to(root):
            if not any(part.startswith(".") for part in path.relative_to(root).parts):
                return path
    raise PathNotAllowed(f"{shown(str(text), 200)} is not a file the dashboard may read: use a "
                         "file under the working directory, the cache or ../shared/data, or add "
                         f"its folder to ${ENV}")


def check_model(name: str) -> str:
    """A model as a link, the model box or a page names it, unchanged when it may be loaded: a
    registry name or a hub id (owner/name) resolves under the working directory and names no
    file elsewhere; a local directory must lie in an allowed folder. PathNotAllowed otherwise,
    in the same words whether or not the directory exists."""
    check_path(name)
    return name


def check_source(text: str) -> str:
    """A data set as typed: hub sources (hf:...) pass; names and paths must resolve inside an
    allowed folder (a bare name like 'gsm8k' resolves under the working directory)."""
    text = (text or "").strip()
    if not text.startswith("hf:"):
        check_path(text)
    return text
