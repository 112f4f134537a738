"""The API server's guard (pop_vllm/pop_vllm/guards.py) as an ASGI middleware in front of a
recording app and a fake engine client: which routes answer without the starting process's
secret, the control route's checks, and what reaches the workers. The same guard in front of a
real engine: tests/serving/test_serve_control.py."""
import asyncio
import json

import pytest

from pop_vllm.engine_env import CONTROL_ROUTE, CONTROL_TOKEN_ENV
from pop_vllm.guards import MAX_BODY, ControlGuard, is_open
from pop_vllm.run_setting import RunSetting

SECRET = "s3cret-0123456789"


class Client:
    """engine_client.collective_rpc as the API server's state holds it."""

    def __init__(self, fail: str | None = None):
        self.calls, self.fail = [], fail

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append((method, args))
        if self.fail:
            raise RuntimeError(f"Worker failed with error:\nSettingError: {self.fail}")
        return [{"variant": args[0]["variant"] if args else None}] * 2


class App:
    """The rest of the server: records which paths got through."""

    def __init__(self, client):
        self.seen = []
        self.state = type("State", (), {"engine_client": client})()

    async def __call__(self, scope, receive, send):
        self.seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def guard(monkeypatch, secret: str | None = SECRET, client=None):
    if secret is None:
        monkeypatch.delenv(CONTROL_TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(CONTROL_TOKEN_ENV, secret)
    app = App(client or Client())
    return ControlGuard(app), app


def request(g, app, path, method="POST", secret=None, body=b"", kind="http"):
    """(status or websocket close code, JSON body) of one request through the guard."""
    sent = []
    chunks = [body[i:i + 1000] for i in range(0, len(body), 1000)] or [b""]

    async def receive():
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message):
        sent.append(message)

    headers = [(b"content-type", b"application/json")]
    if secret is not None:
        headers.append((b"authorization", f"Bearer {secret}".encode()))
    scope = {"type": kind, "method": method, "path": path, "headers": headers, "app": app,
             "query_string": b"", "root_path": ""}
    asyncio.run(g(scope, receive, send))
    if kind == "websocket":
        return sent[0]["code"], None
    return sent[0]["status"], json.loads(sent[1]["body"] or b"null")


def control(g, app, secret=SECRET, **body):
    return request(g, app, CONTROL_ROUTE, secret=secret, body=json.dumps(body).encode())


def test_the_secret_leaves_the_environment(monkeypatch):
    import os

    guard(monkeypatch)
    assert CONTROL_TOKEN_ENV not in os.environ  # processes started later do not inherit it


def test_inference_and_read_only_routes_need_no_secret(monkeypatch):
    g, app = guard(monkeypatch)
    for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                         ("GET", "/v1/models"), ("GET", "/health"), ("HEAD", "/health"),
                         ("GET", "/metrics"), ("POST", "/tokenize"), ("GET", "/version")):
        assert request(g, app, path, method=method)[0] == 200, (method, path)
    assert app.seen[-1] == "/version"


@pytest.mark.parametrize("method, path", [
    ("POST", "/collective_rpc"), ("POST", "/sleep"), ("POST", "/wake_up"),
    ("POST", "/reset_prefix_cache"), ("GET", "/server_info"), ("POST", "/scale_elastic_ep"),
    ("POST", "/start_profile"), ("POST", "/abort_requests"), ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"), ("POST", "/no_such_route"), ("POST", "//collective_rpc"),
    ("POST", "/v1x/sleep"), ("POST", "/pause"), ("POST", "/update_weights"),
    # routes this allowlist does not know, as a later vLLM might add them under /v1/
    ("POST", "/v1/set_adapter"), ("DELETE", "/v1/models/smollm2-135m"), ("PUT", "/v1/completions"),
    ("POST", "/v1/responses/resp_1/cancel"),
    # an open path with another method or another spelling
    ("POST", "/v1/models"), ("DELETE", "/health"), ("POST", "/v1/completions/"),
    ("POST", "/V1/completions"), ("POST", "/v1//completions"),
])
def test_every_other_request_needs_the_secret(monkeypatch, method, path):
    assert not is_open(method, path)
    g, app = guard(monkeypatch)
    for secret in (None, "guessed", SECRET[:-1], ""):
        status, body = request(g, app, path, method=method, secret=secret)
        assert status == 401 and "control secret" in body["error"]
    assert app.seen == []  # nothing reached the server
    assert request(g, app, path, method=method, secret=SECRET)[0] == 200 and app.seen == [path]
    assert request(g, app, path, kind="websocket")[0] == 1008


def test_the_control_route_runs_plugin_methods_only_with_the_secret(monkeypatch):
    client = Client()
    g, app = guard(monkeypatch, client=client)
    full, pop = RunSetting.full().as_config(), RunSetting((20, 21)).as_config()
    assert control(g, app, secret=None, method="pop_set", args=[full])[0] == 401
    assert control(g, app, secret="guessed", method="pop_set", args=[full])[0] == 401
    assert client.calls == []
    status, body = control(g, app, method="pop_set", args=[pop])
    assert status == 200 and body == {"results": [{"variant": "pop"}] * 2}
    assert client.calls == [("pop_set", (pop,))]
    for body, words in (({"method": "load_model"}, "method must be one of"),
                        ({"method": "pop_set", "args": "x"}, "args must be a list")):
        status, reply = control(g, app, **body)
        assert status == 400 and words in reply["error"]
    assert request(g, app, CONTROL_ROUTE, secret=SECRET, body=b"not json")[0] == 400
    big = json.dumps({"method": "pop_set", "args": ["x" * MAX_BODY]}).encode()
    status, body = request(g, app, CONTROL_ROUTE, secret=SECRET, body=big)
    assert status == 400 and "larger than" in body["error"]
    assert request(g, app, CONTROL_ROUTE, method="GET", secret=SECRET)[0] == 405
    assert request(g, app, CONTROL_ROUTE, secret=SECRET, kind="websocket")[0] == 1008
    assert len(client.calls) == 1 and app.seen == []  # the server's own routes never saw them


def test_a_refused_setting_is_one_line(monkeypatch):
    g, app = guard(monkeypatch, client=Client(fail="layer(s) 40 out of range"))
    status, body = control(g, app, method="pop_set", args=[RunSetting([40]).as_config()])
    assert status == 400 and body["error"] == "SettingError: layer(s) 40 out of range"


def test_without_a_secret_the_control_route_is_off(monkeypatch):
    g, app = guard(monkeypatch, secret=None)
    status, body = control(g, app, secret="", method="pop_stats")
    assert status == 403 and "started without" in body["error"]
    assert request(g, app, "/collective_rpc", secret="")[0] == 401
