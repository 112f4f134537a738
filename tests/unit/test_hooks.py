"""Hooks live exactly as long as their `with` block, also when it raises."""
import pytest
import torch

from pop_analysis.engine.hooks import Hooks


def test_hooks_run_inside_the_block_and_are_gone_after_it():
    lin, seen = torch.nn.Linear(2, 2), []
    with Hooks() as hooks:
        hooks.before(lin, lambda mod, args: seen.append("before"))
        hooks.after(lin, lambda mod, args, out: seen.append("after"))
        lin(torch.zeros(1, 2))
    lin(torch.zeros(1, 2))
    assert seen == ["before", "after"] and not lin._forward_hooks and not lin._forward_pre_hooks


def test_hooks_are_removed_when_the_block_raises():
    lin = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="mid-run"):
        with Hooks() as hooks:
            hooks.after(lin, lambda *_: None, with_kwargs=True)
            raise RuntimeError("mid-run")
    assert not lin._forward_hooks
