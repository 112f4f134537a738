"""The `vllm.general_plugins` entry point: registers the Pop* architectures.

vLLM loads general plugins in every process (front end, engine core, workers, the registry's
inspection subprocess), so `register` is idempotent. It checks the settings in the front end
(vLLM's per-architecture config hook), before any engine process starts, so a bad skip set,
variant or engine option fails there with one line.
"""
from __future__ import annotations

import logging

from .settings import (
    ARCHITECTURES,
    EAGER_PIPELINE_REASON,
    SUPPORTED_VLLM,
    PopSettingsError,
    engine_setting,
    untested_backends_allowed,
)

log = logging.getLogger("pop_vllm")
_done = False


def register() -> None:
    global _done
    if _done:
        return
    _done = True
    import vllm
    from vllm import ModelRegistry

    version = getattr(vllm, "__version__", "unknown")
    if version != SUPPORTED_VLLM:
        log.warning("pop_vllm: vLLM %s is not supported (tested with %s only); POP models are not "
                    "registered", version, SUPPORTED_VLLM)
        return
    for pop_arch in ARCHITECTURES.values():
        if pop_arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(pop_arch, f"pop_vllm.models:{pop_arch}")
    _register_config_checks()
    from .patching import install

    install()  # every replaced or added vLLM attribute: the table in patches.py


def check_config(vllm_config) -> None:
    """Settings the POP models cannot run with, as one-line SettingErrors."""
    from .repair import check_settings

    hf = vllm_config.model_config.hf_config
    pop = engine_setting(getattr(hf, "pop", None), hf.num_hidden_layers)
    check_settings(pop, hf)
    transfer = vllm_config.kv_transfer_config
    if (transfer is not None and transfer.kv_connector == "ExampleConnector"
            and transfer.is_kv_producer):
        log.warning("pop_vllm: ExampleConnector saves through per-layer hooks that POP's skipped "
                    "layers do not call for pruned tokens, and only a prompt's first chunk: use "
                    "pop_vllm's PopKVConnector (docs/serving.md)")
    runner = getattr(vllm_config.model_config, "runner_type", "generate")
    if runner != "generate":
        raise PopSettingsError(f"the POP plugin serves generation only: runner {runner!r} is not "
                               "supported (a pooling model's output is every prompt position's "
                               "hidden state, which POP computes on the truncated path)")
    if vllm_config.speculative_config is not None:
        raise PopSettingsError("speculative decoding is not supported with the POP plugin")
    from vllm.config import CompilationMode
    from vllm.platforms import current_platform

    # This hook runs before vLLM turns enforce_eager into CompilationMode.NONE: read both.
    eager = (vllm_config.model_config.enforce_eager
             or vllm_config.compilation_config.mode == CompilationMode.NONE)
    if current_platform.is_cpu() and vllm_config.parallel_config.pipeline_parallel_size > 1 \
            and eager:
        raise PopSettingsError(f"{EAGER_PIPELINE_REASON} (drop --enforce-eager)")

    if not current_platform.is_cpu() and not untested_backends_allowed():
        raise PopSettingsError("the POP plugin is tested on vLLM's CPU backend only; set "
                               "POP_VLLM_UNTESTED_BACKENDS=1 to run it on this platform anyway")
    if vllm_config.use_v2_model_runner:
        raise PopSettingsError("the POP plugin hooks vLLM's V1 model runner: set "
                               "VLLM_USE_V2_MODEL_RUNNER=0")


def _register_config_checks() -> None:
    from vllm.model_executor.models.config import (
        MODELS_CONFIG_MAP,
        VerifyAndUpdateConfig,
    )

    class PopConfig(VerifyAndUpdateConfig):
        @staticmethod
        def verify_and_update_config(vllm_config) -> None:
            check_config(vllm_config)

    for pop_arch in ARCHITECTURES.values():
        MODELS_CONFIG_MAP.setdefault(pop_arch, PopConfig)
