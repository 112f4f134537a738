"""The prefill/decode proxy of a disaggregated topology: vLLM's router (the `vllm-router` package,
a maintained Rust binary that scripts/install_vllm.sh puts in the serving venv) in its P/D mode.

For each request it sends the prefill instance a copy with max_tokens 1 and kv_transfer_params
{"do_remote_decode": true}, then sends the request to the decode instance with the
kv_transfer_params the prefill instance answered (vLLM's NIXL protocol, which the POP KV
connector speaks), and streams the decode instance's answer back. It runs like an engine: the
leader of its own process group under the watchdog, on 127.0.0.1 only, stopped with its parent.
Retries are off: with one prefill instance a retry only delays the one clear error a client gets
when that instance dies.
"""
from __future__ import annotations

import os

from pop_analysis.serving import venv
from pop_analysis.serving.server import HOST, Engine, EngineSpec, free_port
from pop_analysis.serving.venv import ServingError

ROUTER = "vllm-router 0.1.17"


def has_router() -> bool:
    return any(venv.venv_dir().glob("lib/python3*/site-packages/vllm_router_rs*"))


class Proxy(Engine):
    """vllm-router between prefill and decode instances (URLs without /v1)."""

    milestones = ((r"Waiting for .* to become healthy", "waiting for the instances"),
                  (r"VllmPDRouter created", "joining prefill and decode"),
                  (r"Starting server on", "ready"))

    def __init__(self, spec: EngineSpec, prefill: list[str], decode: list[str], log_dir=None):
        super().__init__(spec, log_dir)
        if not prefill or not decode:
            raise ServingError("a disaggregated topology needs a prefill and a decode instance")
        self.prefill, self.decode = list(prefill), list(decode)

    def _command(self, python: str, port: int) -> list[str]:
        if not has_router():
            raise ServingError(f"the P/D proxy ({ROUTER}) is not installed in "
                               f"{venv.venv_dir().name}: run `bash {venv.INSTALL_SCRIPT}`")
        urls = [a for u in self.prefill for a in ("--prefill", u)]
        urls += [a for u in self.decode for a in ("--decode", u)]
        return [python, "-m", "vllm_router.launch_router", "--vllm-pd-disaggregation", *urls,
                "--policy", "round_robin", "--disable-retries", "--host", HOST, "--port", str(port),
                "--prometheus-host", HOST, "--prometheus-port", str(free_port())]

    def _env(self) -> dict:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}
        env.pop("VIRTUAL_ENV", None)
        return env
