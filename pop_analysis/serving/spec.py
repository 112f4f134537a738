"""From what a user names (a model, a skip set, a variant) to an EngineSpec, without loading the
model: the engine reads the weights itself, this only needs config.json."""
from __future__ import annotations

import json
from pathlib import Path

from pop_analysis.engine.models import resolve_source
from pop_analysis.serving.server import EngineSpec
from pop_analysis.serving.venv import ServingError
from pop_vllm.engine_env import rank_cpus
from pop_vllm.settings import EAGER_PIPELINE_REASON, NO_KV_REASON
from pop_vllm.variants import SERVED, Variant

VARIANTS = SERVED  # what the plugin serves


def model_dir(name: str) -> str:
    """A registry name or a local directory -> the directory vLLM loads (hub ids are refused:
    the engine runs offline)."""
    source, local = resolve_source(name)
    if not local:
        raise ServingError(f"the serving engine runs offline: give a registry name or a local "
                           f"model directory, not the hub id {name!r}")
    return str(Path(source).resolve())


def text_config(directory: str) -> dict:
    try:
        cfg = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ServingError(f"{directory} has no readable config.json ({e})") from None
    return cfg.get("text_config", cfg)


def n_layers(directory: str) -> int:
    return int(text_config(directory)["num_hidden_layers"])


def check_parallel(directory: str, tensor: int, pipeline: int, eager: bool = True) -> None:
    """One line for a parallel layout the model or vLLM's CPU backend cannot take (vLLM would
    fail mid-start or at the first step), or one with more ranks than this process has cores."""
    if pipeline > 1 and eager:
        raise ServingError(f"{EAGER_PIPELINE_REASON} (add --compiled)")
    cfg = text_config(directory)
    heads = int(cfg.get("num_attention_heads", 1))
    if heads % tensor:
        raise ServingError(f"tensor parallel size {tensor} does not divide the model's {heads} "
                           "attention heads")
    if pipeline > int(cfg["num_hidden_layers"]):
        raise ServingError(f"pipeline parallel size {pipeline} exceeds the model's "
                           f"{cfg['num_hidden_layers']} layers")
    try:
        rank_cpus(tensor * pipeline)  # a core per rank
    except ValueError as e:
        raise ServingError(str(e)) from None


def make_spec(model: str, skip: tuple[int, ...], variant: str = "pop", repair: str | None = None,
              **engine) -> EngineSpec:
    """The engine for `model` (registry name or directory) with this skip set and variant;
    `repair`: the maps file of pop_repair (repair.store.maps_path)."""
    if variant == Variant.POP_NO_KV:
        raise ServingError(NO_KV_REASON)
    if variant not in VARIANTS:
        raise ServingError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    if variant != "full" and not skip:
        raise ServingError(f"variant {variant} needs a non-empty skip set")
    if (variant == "pop_repair") != bool(repair):
        raise ServingError("variant pop_repair needs a repair (--repair KEY or auto)"
                           if repair is None else f"a repair is used by variant pop_repair only, "
                           f"not {variant}")
    directory = model_dir(model)
    check_parallel(directory, engine.get("tensor_parallel", 1), engine.get("pipeline_parallel", 1),
                   engine.get("eager", True))
    return EngineSpec(model_dir=directory, name=Path(model).name if "/" in model else model,
                      skip=tuple(skip) if variant != "full" else (), variant=variant,
                      repair=repair, **engine)
