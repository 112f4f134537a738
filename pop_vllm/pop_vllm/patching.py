"""Apply the patch table (patches.PATCHES) once per process: vLLM loads plugins in every process,
and some of them more than once."""
from __future__ import annotations

import importlib

from .patches import PATCHES, Patch

MARK = "_pop_wrapped"  # set on every replacement, so a second install leaves it alone


def _owner(path: str):
    module, _, name = path.partition(":")
    owner = importlib.import_module(module)
    return getattr(owner, name) if name else owner


def _builder(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def apply(patch: Patch) -> None:
    owner = _owner(patch.owner)
    if patch.added:
        if not hasattr(owner, patch.attribute):
            setattr(owner, patch.attribute, _builder(patch.builder))
        return
    original = getattr(owner, patch.attribute)
    if getattr(original, MARK, False):
        return
    replacement = _builder(patch.builder)(original)
    setattr(replacement, MARK, True)
    setattr(owner, patch.attribute, replacement)


def install() -> None:
    for patch in PATCHES:
        apply(patch)
