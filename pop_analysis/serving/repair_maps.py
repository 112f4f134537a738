"""The maps file of a stored K/V repair for the engine's pop_repair variant.

The POP plugin reads a repair's maps straight from the store's KEY.safetensors (tensors
"L.k.weight", "L.k.bias", "L.v.weight", "L.v.bias" per skipped layer) and checks them against the
model and skip set itself; here the repair is named (a store key, or auto: the newest stored for
this model and skip set, else a fit on the builtin prompts), checked against the loaded model and
turned into that file's absolute path.
"""
from __future__ import annotations

from pathlib import Path

from pop_analysis.serving.venv import ServingError


def maps_path(lm, skip, spec: str, progress=None) -> str:
    """Absolute path of the maps file of repair `spec` (KEY or "auto") for `lm` and `skip`;
    one-line RepairError / ServingError when there is none that fits."""
    from pop_analysis.repair.store import ensure, maps_file

    key = tuple(sorted(int(i) for i in skip))
    before = lm.adapter.kv_maps.get(key)  # a repair attached for POP Lab's own runs stays
    try:
        rep = ensure(lm, skip, spec, progress)  # refuses another model or skip set in one line
    finally:
        if before is None:
            lm.adapter.kv_maps.pop(key, None)
        else:
            lm.adapter.kv_maps[key] = before
    path = maps_file(rep.key) if rep.key else None
    if path is None or not path.is_file():
        raise ServingError(f"repair {rep.key or '(unsaved)'} has no maps file in the store (the "
                           "engine reads the maps from it); check that cache/results/repair is "
                           "writable and fit it again")
    return str(Path(path).resolve())


def resolve(model: str, skip, spec: str | None, progress=None) -> str:
    """--repair of the serving commands: load `model` in POP Lab (the repair's model check and
    any fit need it) and return the maps file's path."""
    if not spec:
        raise ValueError("the pop_repair variant needs --repair KEY or --repair auto")
    from pop_analysis.engine.models import load_model
    from pop_analysis.engine.pop import RepairError
    from pop_analysis.repair.store import maps_file

    stored = maps_file(spec) if spec != "auto" else None
    if spec != "auto" and (stored is None or not stored.is_file()):  # before loading the model
        raise RepairError(f"no stored repair {spec!r:.40} (python -m pop_analysis repair list)")
    return maps_path(load_model(model, device="cpu"), skip, spec, progress)
