"""The client side of an engine's run-time control: a secret per engine, made here and handed to
the engine in its environment only, and the calls to the plugin's control route with it.

The engine's guard (pop_vllm/pop_vllm/guards.py) answers the control route, and every route that
changes the engine, only with this secret; vLLM's development routes stay off
(VLLM_SERVER_DEV_MODE is never set), so another local user of the machine cannot switch, stop or
drive the engine (docs/serving.md, "The run-time switch").
"""
from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request

from pop_analysis.serving.venv import ServingError
from pop_vllm.engine_env import CONTROL_ROUTE, CONTROL_TOKEN_ENV

__all__ = ["CONTROL_TOKEN_ENV", "new_secret", "call"]


def new_secret() -> str:
    return secrets.token_urlsafe(32)  # 256 random bits


def call(url: str, secret: str, method: str, args=(), timeout: float = 60) -> list:
    """One control call (a worker method of pop_vllm.control on every worker): the workers'
    results, or ServingError with the engine's one-line answer."""
    body = json.dumps({"method": method, "args": list(args)}).encode()
    req = urllib.request.Request(f"{url}{CONTROL_ROUTE}", body,
                                 {"Content-Type": "application/json",
                                  "Authorization": f"Bearer {secret}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.load(r)["results"]
    except urllib.error.HTTPError as e:
        raise ServingError(f"the engine refused {method} (HTTP {e.code}): {_error(e)}") from None


def _error(e: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(e.read(4096)).get("error"))[:300]
    except (ValueError, AttributeError, OSError):
        return e.reason
