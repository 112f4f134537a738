"""Is the Hugging Face hub reachable? Asked once before a hub download, so that a machine without
a network fails in a second with one line instead of retrying for half a minute."""
from __future__ import annotations

import os
import socket
import threading
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 2.0  # DNS lookup and TCP connect, each
TRUE = {"1", "on", "yes", "true"}


def offline_by_setting() -> bool:
    """HF_HUB_OFFLINE (or HF_DATASETS_OFFLINE / TRANSFORMERS_OFFLINE) asks for no network use."""
    return any(os.environ.get(v, "").strip().lower() in TRUE
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def endpoint() -> tuple[str, int]:
    """(host, port) of the hub: $HF_ENDPOINT when set (a mirror), else huggingface.co."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def unreachable_reason(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the hub answers a TCP connect; else why not, in a few words."""
    if offline_by_setting():
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # only the proxy knows; let the download itself try
    host, port = endpoint()
    found: list = []
    # getaddrinfo has no timeout of its own: a daemon thread lets a hung resolver be abandoned.
    lookup = threading.Thread(target=_resolve, args=(host, port, found), daemon=True)
    lookup.start()
    lookup.join(timeout_s)
    if not found or isinstance(found[0], OSError):
        return f"{host} cannot be resolved"
    try:
        with socket.create_connection(found[0], timeout=timeout_s):
            return None
    except OSError:
        return f"{host}:{port} does not answer"


def _resolve(host: str, port: int, out: list) -> None:
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        out.append(info[0][4][:2])
    except OSError as e:
        out.append(e)
