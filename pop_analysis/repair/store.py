"""Fitted repairs on disk and on the runtime: store, list, load, check, attach, ensure.

A repair lives under cache/results/repair/ as KEY.safetensors (the maps, float32, never pickle)
beside KEY.json (the store's sidecar: model identity, skip set, data, settings, fit statistics).
KEY hashes the model identity, skip set, data fingerprint and settings. Attaching registers the
maps on the model's adapter for their skip set, where the pop_repair variant finds them; a repair
fitted for another model or skip set is refused with one line.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pop_analysis.engine.pop import RepairError
from pop_analysis.engine.skipset import describe
from pop_analysis.engine.weight_values import nonfinite_tensor
from pop_analysis.errors import first_line
from pop_analysis.repair.fit import (
    Repair,
    RepairConfig,
    calibration,
    check_block,
    checkpoint_fingerprint,
    fit_repair,
    model_identity,
)
from pop_analysis.store import results as store

if TYPE_CHECKING:
    from pop_analysis.engine.models import LoadedModel

KIND = "repair"  # store kind




def _params(model: dict, skip, data_fingerprint: str, cfg: RepairConfig) -> dict:
    """The parameters that determine a repair (hashed into its store key)."""
    model = {k: v for k, v in model.items() if k != "name"}  # the same weights under any name
    return {"model": model, "skip": [int(i) for i in skip], "data": data_fingerprint,
            "config": dataclasses.asdict(cfg)}


def params_of(rep: Repair) -> dict:
    return _params(rep.model, rep.skip, rep.info["data"]["fingerprint"], rep.config)


def _path(key: str) -> Path | None:
    """The maps' file of a store key; None for anything else (no paths from input)."""
    entry = store.entry_path(KIND, key)
    return None if entry is None else entry.with_suffix(".safetensors")


def entry_exists(key: str) -> bool:
    """Whether `key` names a stored repair with its maps file (nothing is read)."""
    path = _path(key)
    return path is not None and path.is_file() and store.entry_path(KIND, key).is_file()


def save(rep: Repair) -> Repair:
    """Write the maps (atomically) and then the sidecar; returns the repair with its key."""
    from safetensors.torch import save_file

    params = params_of(rep)
    rep.key = store.make_key(params)
    folder = store.results_dir(KIND)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{rep.key}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(rep.tensors, tmp, metadata={"key": rep.key, "skip": describe(rep.skip)})
        os.replace(tmp, _path(rep.key))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    payload = {"skip": list(rep.skip), "model": rep.model, "config": dataclasses.asdict(rep.config),
               "info": rep.info}
    store.save(KIND, rep.key, payload, {**params, "name": rep.model["name"],
                                        "data_name": rep.info["data"]["name"],
                                        "n_tokens": rep.info["n_tokens"]})
    return rep


def load(key: str) -> Repair:
    """A stored repair by key; a one-line RepairError when missing or unreadable."""
    from safetensors.torch import load_file

    path = _path(key)
    payload = store.load(KIND, key) if path is not None else None
    if payload is None or not path.is_file():
        raise RepairError(f"no stored repair {key!r:.40} (python -m pop_analysis repair list)")
    try:
        tensors = load_file(str(path))
        cfg = dict(payload["config"], alphas=tuple(payload["config"]["alphas"]))
        rep = Repair(key, tuple(int(i) for i in payload["skip"]), dict(payload["model"]),
                     RepairConfig(**cfg), tensors, dict(payload["info"]))
        _check_tensors(rep)
        return rep
    except Exception as e:  # noqa: BLE001 - a damaged file or sidecar: one line
        raise RepairError(f"stored repair {key} is unreadable ({first_line(e)}); delete it "
                          "and fit again") from None


def _check_tensors(rep: Repair) -> None:
    """The maps a stored repair must hold: per skipped layer a (out, D) weight and (out,) bias
    for K and for V, of a float type (half precision is upcast), finite."""
    want = {f"{i}.{n}.{p}" for i in rep.skip for n in "kv" for p in ("weight", "bias")}
    if set(rep.tensors) != want:
        raise ValueError(f"its maps do not cover skip set {describe(rep.skip)}")
    for name, t in rep.tensors.items():
        if t.dim() != (2 if name.endswith("weight") else 1):
            raise ValueError(f"map {name} is malformed")
        if not t.is_floating_point():
            raise ValueError(f"map {name} is stored as {str(t.dtype).removeprefix('torch.')}, "
                             "not a float type")
    bad = nonfinite_tensor(sorted(rep.tensors.items()))
    if bad:
        raise ValueError(bad.replace("tensor", "map", 1))


def entries(lm: LoadedModel | None = None, skip=None) -> list[dict]:
    """Stored repairs, newest first; only those matching `lm` (and `skip`) when given."""
    out = store.entries(KIND)
    if lm is not None:
        fp = model_identity(lm)["fingerprint"]
        out = [e for e in out if e["params"].get("model", {}).get("fingerprint") == fp]
    if skip is not None:
        want = sorted(int(i) for i in skip)
        out = [e for e in out if e["params"].get("skip") == want]
    return out


def listing(lm: LoadedModel | None = None, skip=None, notice=None) -> list[dict]:
    """One row per stored repair (newest first; `lm` / `skip` filter as in `entries`): what it
    was fitted on, how long it took, the last skipped layer's R^2 of plain POP's projection and
    of the fitted map, and the bytes of its maps in float32 (from the sidecar; the maps are not
    read)."""
    rows = []
    for e in entries(lm, skip):
        p = e["params"]
        payload = store.load(KIND, e["key"])
        reason = "its record is unreadable" if payload is None else unusable(e["key"], p)
        if reason:
            (notice or store.warn)(f"stored repair {e['key']} not listed: {reason} (delete it, "
                                   "or fit again)")
            continue
        info, model = payload.get("info", {}), p.get("model", {})
        last = info.get("fit", {}).get(str((p.get("skip") or [None])[-1]), {})
        per_map = model.get("kv_dim", 0) * (model.get("hidden", 0) + 1)  # weight and bias
        rows.append({"key": e["key"], "model": p.get("name"), "skip": p.get("skip") or [],
                     "data": p.get("data_name"), "n_tokens": p.get("n_tokens"),
                     "saved_at": e["saved_at"], "seconds": info.get("seconds"),
                     "last_layer_r2": {q: (last.get(f"{q}_r2_pop"), last.get(f"{q}_r2_loo"))
                                       for q in "kv"},
                     "repair_bytes": 2 * len(p.get("skip") or []) * per_map * 4})
    return rows


def unusable(key: str, params: dict) -> str | None:
    """Why a stored repair's maps file cannot be used, from its header alone; None when it can."""
    from safetensors import safe_open

    path = _path(key)
    if path is None or not path.is_file():
        return "its maps file is missing"
    want = {f"{i}.{n}.{q}" for i in params.get("skip") or [] for n in "kv" for q in ("weight", "bias")}
    try:
        with safe_open(str(path), "pt") as f:
            have = set(f.keys())
    except Exception as e:  # noqa: BLE001 - any damage reads as one reason
        return f"its maps file is damaged ({first_line(e)})"
    return None if have == want else "its maps file does not cover its skip set"


def check_compatible(lm: LoadedModel, rep: Repair, skip=None) -> None:
    """Refuse, in one line, a repair fitted for another model or another skip set."""
    mine = model_identity(lm)
    theirs = {k: v for k, v in rep.model.items() if k != "name"}
    if any(mine.get(k) != v for k, v in theirs.items()):
        raise RepairError(f"repair {rep.key or '(unsaved)'} was fitted for model "
                          f"{rep.model.get('name')} ({rep.model.get('fingerprint')}), not for "
                          f"{mine['name']} ({mine['fingerprint']})")
    if skip is not None and tuple(sorted(int(i) for i in skip)) != tuple(rep.skip):
        raise RepairError(f"repair {rep.key or '(unsaved)'} was fitted for skip set "
                          f"{describe(rep.skip)}, not {describe(skip)}")


def attach(lm: LoadedModel, rep: Repair, skip=None) -> Repair:
    """Register the repair's maps on the model for its skip set (pop_repair then uses them),
    once their shapes fit the model and their scale is sane."""
    check_compatible(lm, rep, skip)
    try:
        built = lm.adapter.register_kv_maps(rep.skip, rep.maps(), rep.key)
    except ValueError as e:
        raise RepairError(f"repair {rep.key or '(unsaved)'} does not fit this model: {e}") from None
    try:
        check_scale(lm, rep, built)
    except RepairError:
        lm.adapter.kv_maps.pop(tuple(rep.skip), None)
        raise
    return rep


SCALE_BOUND = 1e3  # a map whose outputs differ from the layer's own projection's by more is broken
SCALE_TOKENS = 16  # embedding rows the two are compared on


@torch.no_grad()
def check_scale(lm: LoadedModel, rep: Repair, built) -> None:
    """The maps' output norm on a few tokens against the layer's own projection: finite maps of
    an absurd scale (x1e30) would give empty answers with exit code 0."""
    a = lm.adapter
    emb = a.base.embed_tokens.weight[:SCALE_TOKENS]  # (T, D)
    for i, (k_map, v_map) in built.maps.items():
        for name, fitted, own in (("k", k_map, a.k_proj(i)), ("v", v_map, a.v_proj(i))):
            x = emb.to(own.weight.device, own.weight.dtype)  # (T, D)
            ratio = (fitted(x).float().norm() / own(x).float().norm().clamp_min(1e-12)).item()
            if not (1 / SCALE_BOUND <= ratio <= SCALE_BOUND):
                raise RepairError(f"repair {rep.key or '(unsaved)'}: map {i}.{name} gives outputs "
                                  f"{ratio:.3g} times the layer's own projection on {len(x)} "
                                  "tokens; delete it and fit again")


def fit_and_store(lm: LoadedModel, skip, cfg: RepairConfig = RepairConfig(), progress=None,
                  use_cache: bool = True, notice=None) -> tuple[Repair, bool]:
    """(repair, was_stored): the stored repair for these settings and data, or fit and store.
    A store that cannot be written costs only the storing: notice(line) hears it (default: a
    StoreWarning) and the fitted repair is returned all the same."""
    skip = check_block(skip, lm.adapter.n_layers)
    data = calibration(lm, cfg)
    key = store.make_key(_params(model_identity(lm), skip, data.fingerprint, cfg))
    if use_cache and store.load(KIND, key) is not None and _path(key).is_file():  # a full entry
        try:
            return load(key), True
        except RepairError as e:
            (notice or store.warn)(f"{e}; fitting it again")
    rep = fit_repair(lm, skip, cfg, progress, data)
    try:
        return save(rep), False
    except OSError as e:  # the fit is kept for this run: a cache that cannot be written costs
        rep.key = key  # only the caching, as for every other result
        (notice or store.warn)(f"repair {key} not stored under {store.results_dir(KIND)} "
                               f"({e.strerror or first_line(e)}); it is used for this run only")
        return rep, False


def ensure(lm: LoadedModel, skip, spec="auto", progress=None) -> Repair:
    """Attach a repair for this skip set: spec is a store key, "auto" (the newest stored one for
    this model and skip set, else a fit with the default settings) or a RepairConfig."""
    skip = check_block(skip, lm.adapter.n_layers)
    if isinstance(spec, RepairConfig):
        return attach(lm, fit_and_store(lm, skip, spec, progress)[0], skip)
    if spec == "auto":
        for entry in entries(lm, skip):  # newest first; an unusable one is passed over
            try:
                return attach(lm, load(entry["key"]), skip)
            except RepairError as e:
                store.warn(f"{e}; trying the next one, else fitting a new one")
        return attach(lm, fit_and_store(lm, skip, RepairConfig(), progress)[0], skip)
    return attach(lm, load(str(spec)), skip)


def maps_file(key: str) -> str:
    """Absolute path of stored repair `key`'s maps file, the file vLLM's pop_repair reads (from
    the store alone: no model is loaded or touched); one-line RepairError when there is none."""
    path = _path(key)
    if path is None or not entry_exists(key):
        raise RepairError(f"no stored repair {key!r:.40} with a maps file (python -m pop_analysis "
                          "repair list)")
    return str(path.resolve())


def stored_maps_file(directory, n_layers: int, skip, spec: str) -> str | None:
    """The maps file of repair `spec` (KEY or "auto": the newest usable one) fitted for the
    checkpoint in `directory` and skip set `skip`, from the store and the checkpoint's K/V weights
    alone (no model is built); None for "auto" when none is stored (a fit needs the model)."""
    fp, want = checkpoint_fingerprint(directory, n_layers), sorted(int(i) for i in skip)
    fits = [e for e in store.entries(KIND) if spec == "auto" or e["key"] == spec]
    if spec != "auto" and not fits:
        raise RepairError(f"no stored repair {spec!r:.40} (python -m pop_analysis repair list)")
    for e in fits:
        p = e["params"]
        problem = (unusable(e["key"], p)
                   or (p.get("model", {}).get("fingerprint") != fp and "it was fitted for "
                       f"another checkpoint than {Path(directory).name}")
                   or (p.get("skip") != want and f"it was fitted for skip set "
                       f"{describe(p.get('skip') or ())}, not {describe(want)}"))
        if not problem:
            return maps_file(e["key"])
        if spec != "auto":
            raise RepairError(f"stored repair {spec}: {problem}")
    return None


def memory(lm: LoadedModel, rep: Repair) -> dict:
    """Bytes of the extra projections (in the model's dtype) beside the model's own size."""
    params = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    extra = rep.nbytes(lm.dtype)
    return {"repair_bytes": extra, "model_bytes": params, "share": extra / params}
