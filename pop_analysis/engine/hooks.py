"""Module hooks that live exactly as long as a `with` block.

    with Hooks() as hooks:
        hooks.after(adapter.layers[i], record)       # register_forward_hook
        hooks.before(adapter.o_proj(i), record_in)   # register_forward_pre_hook
        ...run the model...
    # every handle is removed here, also when the block raised

Every recorder, counter and gate of the library registers its hooks through one of these, so a
hook never outlives the run it was made for (a leaked hook would record, count or gate every
later forward of the shared model). Gate hooks stay registered through backward() because the
block encloses it.
"""
from __future__ import annotations


class Hooks:
    """The handles registered on it, all removed (newest first) when its block ends."""

    def __init__(self):
        self.handles = []

    def after(self, module, fn, **kw) -> None:
        """fn(module, args, output[, kwargs]) after module's forward (register_forward_hook)."""
        self.handles.append(module.register_forward_hook(fn, **kw))

    def before(self, module, fn, **kw) -> None:
        """fn(module, args[, kwargs]) before module's forward (register_forward_pre_hook)."""
        self.handles.append(module.register_forward_pre_hook(fn, **kw))

    def __enter__(self) -> "Hooks":
        return self

    def __exit__(self, *exc) -> None:
        while self.handles:
            self.handles.pop().remove()
