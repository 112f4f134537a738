"""A checkpoint must hold the model: every parameter of the architecture comes from it.

transformers fills whatever a checkpoint lacks with fresh random values and only logs it (a logger
the CLI and the dashboard silence), so a folder with the right config and the wrong safetensors
would generate garbage with exit code 0. `weight_problems` reads transformers' loading report
(from_pretrained(..., output_loading_info=True)) and names what is wrong, for one error line.
Allowed by name: tied weights (filled from their twin) and buffers the model computes itself.
"""
from __future__ import annotations

SHOWN = 3  # tensor names quoted per kind of problem

# Checkpoint entries older exports still carry that no supported architecture loads.
IGNORED_UNEXPECTED = (".rotary_emb.inv_freq",)


def legitimately_absent(model) -> set[str]:
    """Names a checkpoint may leave out: tied parameters and buffers."""
    names = {name for name, _ in model.named_buffers()}
    return names | set(getattr(model, "all_tied_weights_keys", None) or {})  # tied: target -> source


def weight_problems(model, info: dict) -> list[str]:
    """One phrase per kind of problem in the loading report; empty when the checkpoint is whole."""
    allowed = legitimately_absent(model)
    missing = sorted(k for k in info.get("missing_keys", ()) if k not in allowed)
    unexpected = sorted(k for k in info.get("unexpected_keys", ())
                        if not k.endswith(IGNORED_UNEXPECTED))
    shapes = sorted(info.get("mismatched_keys", ()))  # (name, checkpoint shape, model shape)
    out = []
    if missing:
        out.append(f"{len(missing)} missing ({_first(missing)})")
    if unexpected:
        out.append(f"{len(unexpected)} unexpected ({_first(unexpected)})")
    if shapes:
        named = [f"{k} {tuple(a)} in the checkpoint, {tuple(b)} in the model" for k, a, b in shapes]
        out.append(f"{len(shapes)} of the wrong shape ({_first(named)})")
    return out


def _first(items: list[str]) -> str:
    return ", ".join(items[:SHOWN]) + (", ..." if len(items) > SHOWN else "")
