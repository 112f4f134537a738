"""POP for vLLM: registered through the `vllm.general_plugins` entry point (`plugin.register`).

The pure modules (plan, settings, engine_env) import neither vLLM nor torch, so POP Lab's own
test suite can test them without the serving venv.
"""
from .settings import ARCHITECTURES, PopSettingsError, overrides  # noqa: F401
