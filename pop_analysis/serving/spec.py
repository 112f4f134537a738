"""From what a user names (a model and a run setting) to an EngineSpec, without loading the
model: the engine reads the weights itself, this only needs config.json. `spec_for` is the one
way there, for the CLI and the Serve page alike."""
from __future__ import annotations

import json
from pathlib import Path

from pop_analysis.engine.models import resolve_source
from pop_analysis.serving.server import EngineSpec
from pop_analysis.serving.venv import ServingError
from pop_vllm.engine_env import rank_cpus
from pop_vllm.run_setting import RunSetting, SettingError, check_served
from pop_vllm.settings import EAGER_PIPELINE_REASON


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


def spec_for(model: str, setting: RunSetting, **engine) -> EngineSpec:
    """The engine for `model` (registry name or directory) serving `setting` (its pop_repair maps
    file from the repair store: repair.store.maps_file); `engine`: EngineSpec's other fields."""
    if setting.variant != "full" and not setting.skip:
        raise ServingError(f"variant {setting.variant} needs a non-empty skip set")
    directory = model_dir(model)
    try:
        check_served(setting.check(n_layers(directory)))
    except SettingError as e:
        raise ServingError(str(e)) from None
    check_parallel(directory, engine.get("tensor_parallel", 1), engine.get("pipeline_parallel", 1),
                   engine.get("eager", True))
    served = setting if setting.variant != "full" else RunSetting.full()
    return EngineSpec(model_dir=directory, name=Path(model).name if "/" in model else model,
                      setting=served, **engine)
