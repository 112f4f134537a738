"""The API server's guard (`--middleware pop_vllm.guards.ControlGuard`): the run-time full/POP
switch through a route only the starting process can call, and no other route that changes the
engine reachable without its secret.

vLLM's own run-time controls (`/collective_rpc`, `/sleep`, `/reset_prefix_cache`, ...) exist only
with VLLM_SERVER_DEV_MODE=1 and then answer anyone who can reach the port, i.e. every local user.
POP Lab never sets it. Instead:

- POST CONTROL_ROUTE {"method": "pop_set" | "pop_stats" | ..., "args": [...]} runs one of the
  plugin's worker methods (engine_env.CONTROL_METHODS, nothing else) on every worker. It needs
  `Authorization: Bearer <secret>`, the secret given in the engine's environment
  (CONTROL_TOKEN_ENV; /proc/PID/environ is readable by its owner only). Without a secret in the
  environment the route is off (403).
- Requests open without the secret: an allowlist of (method, path) pairs, vLLM 0.32's inference
  and read-only routes (OPEN), matched exactly. Every other request (vLLM's development routes if
  someone turns them on, /scale_elastic_ep, profiling, LoRA loading, aborts, another method on an
  open path, a path spelled otherwise, any route a later vLLM adds, under /v1/ or not) needs the
  secret too.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os

from .engine_env import CONTROL_METHODS as METHODS
from .engine_env import CONTROL_ROUTE, CONTROL_TOKEN_ENV

MAX_BODY = 64 * 1024  # a switch is a skip list, a variant and a path
# Inference and read-only routes of vLLM 0.32's OpenAI-compatible server, by method.
_READ = ("/health", "/ping", "/version", "/load", "/metrics", "/metrics/", "/v1/models", "/docs",
         "/docs/oauth2-redirect", "/redoc", "/openapi.json")
_INFER = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
          "/v1/messages/count_tokens", "/tokenize", "/detokenize", "/invocations", "/ping")
OPEN = frozenset({(m, p) for p in _READ for m in ("GET", "HEAD")} | {("POST", p) for p in _INFER})


def is_open(method: str, path: str) -> bool:
    """Whether a request may reach the server without the secret (exact match: a method or a
    spelling of a path not listed, and every route a later vLLM adds, needs the secret)."""
    return (method.upper(), path) in OPEN


class ControlGuard:
    """Pure ASGI middleware (vLLM adds it outermost, so it sees every request first)."""

    def __init__(self, app):
        self.app = app
        # Taken out of the environment: processes this one starts later do not inherit it.
        token = os.environ.pop(CONTROL_TOKEN_ENV, "")
        self._digest = hashlib.sha256(token.encode()).digest() if token else None

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        # A websocket (vLLM's only one is audio's /v1/realtime) is never open without the secret.
        method = scope.get("method", "GET") if scope["type"] == "http" else "WEBSOCKET"
        if path != CONTROL_ROUTE and (is_open(method, path) or self._authorized(scope)):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":  # refused before it is accepted
            return await send({"type": "websocket.close", "code": 1008})
        if path == CONTROL_ROUTE:
            return await self._control(scope, receive, send)
        return await _reply(scope, receive, send, 401, "this route changes the engine and needs "
                            "the starting process's control secret")

    def _authorized(self, scope) -> bool:
        if self._digest is None:
            return False
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, given = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    hashlib.sha256(given.encode()).digest(), self._digest)
        return False

    async def _control(self, scope, receive, send):
        if scope["method"] != "POST":
            return await _reply(scope, receive, send, 405, f"{CONTROL_ROUTE} takes POST only")
        if self._digest is None:
            return await _reply(scope, receive, send, 403, "the POP control route is off: the "
                                f"engine was started without {CONTROL_TOKEN_ENV}")
        if not self._authorized(scope):
            return await _reply(scope, receive, send, 401, "the POP control route needs the "
                                "starting process's control secret")
        try:
            method, args = _parse(await _body(receive))
        except ValueError as e:
            return await _reply(scope, receive, send, 400, str(e))
        client = scope["app"].state.engine_client
        try:
            results = await client.collective_rpc(method, args=tuple(args))
        except Exception as e:  # noqa: BLE001 - a refused setting: one line, the engine carries on
            return await _reply(scope, receive, send, 400, _one_line(e))
        return await _reply(scope, receive, send, 200, None, {"results": list(results)})


def _parse(raw: bytes) -> tuple[str, list]:
    try:
        body = json.loads(raw)
    except ValueError:
        raise ValueError("the control request must be JSON: {\"method\": ..., \"args\": [...]}") from None
    if not isinstance(body, dict) or body.get("method") not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}")
    args = body.get("args", [])
    if not isinstance(args, list):
        raise ValueError("args must be a list")
    return body["method"], args


async def _body(receive) -> bytes:
    """The request body, refused beyond MAX_BODY bytes before more is read."""
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise ValueError(f"the control request is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _one_line(exc: BaseException) -> str:
    """The worker's error: its last 'SomethingError: text' line, else the first line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    named = [ln for ln in lines if "Error:" in ln]
    return (named[-1] if named else lines[0] if lines else type(exc).__name__)[:500]


async def _reply(scope, receive, send, status: int, error: str | None, content=None):
    from starlette.responses import JSONResponse

    body = content if error is None else {"error": error}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)
