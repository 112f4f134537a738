"""The engines one comparison needs, the load generator, and generation through them.

A POP variant is compared with stock vLLM (the full model, unmodified): two engines on two ports,
the full one started first. Serving `full` alone (an A/A check of the load test's noise) needs
one engine for both sides. Everything is stopped by stop() / the with-block, and by the engines'
own guards (atexit, the parent-death watchdog) if this process ends first.
"""
from __future__ import annotations

import json
import threading
import time
import urllib.request
from dataclasses import replace

from pop_analysis.serving.bench import Client, Target, serve_bench
from pop_analysis.serving.loadgen import LoadGenerator
from pop_analysis.serving.server import Engine, EngineSpec
from pop_analysis.serving.venv import ServingError
from pop_analysis.store.paths import cache_dir
from pop_vllm.run_setting import RunSetting

GENERATE_TIMEOUT_S = 300


class Serving:
    """Engines for `pop`, started in __init__ (blocking, bounded).

    engines="one" (default for a POP variant): one switchable POP engine serves both sides,
    switched to full or POP before each side's run (the same process, memory and batch
    scheduler for both). engines="two": stock vLLM for full beside the POP engine.
    A `full` spec: one stock engine for both sides (an A/A check of the load test's noise)."""

    def __init__(self, pop: EngineSpec, progress=None, timeout_s: float | None = None,
                 engines: str = "one"):
        if engines not in ("one", "two"):
            raise ServingError(f"engines must be one or two, got {engines!r}")
        self.spec = replace(pop, switchable=pop.pop and engines == "one")
        self.engines: dict[str, Engine] = {}
        self.gen: LoadGenerator | None = None
        self._lock = threading.Lock()  # a switch and the requests it is for go together
        kw = {} if timeout_s is None else {"timeout_s": timeout_s}
        stock = replace(pop, setting=RunSetting.full(), port=0)
        wanted = [("pop", self.spec)] if self.spec.switchable else [("full", stock)] + (
            [("pop", self.spec)] if pop.pop else [])
        try:
            for i, (name, spec) in enumerate(wanted):
                engine = Engine(spec)
                self.engines[name] = engine
                engine.start(progress=_labelled(progress, name, i, len(wanted)), **kw)
            for side in self.names:  # the first request of an engine pays its warm-up
                self.generate(side, "Hello", 2)
        except BaseException:
            self.stop()
            raise

    @property
    def names(self) -> list[str]:
        """The sides: ['full', 'pop'] (the variant's name), or ['full'] for an A/A session."""
        return ["full"] + ([str(self.spec.setting.variant)] if self.spec.pop else [])

    def _engine(self, side: str) -> Engine:
        return self.engines["full" if side == "full" and "full" in self.engines else "pop"]

    def _switch(self, side: str) -> None:
        if self.spec.switchable:
            self.engines["pop"].switch(RunSetting.full() if side == "full" else self.spec.setting)

    def target(self, side: str) -> Target:
        e = self._engine(side)
        return Target(side, e.url, before=lambda: self._switch(side), check=e.check)

    def alive(self) -> bool:
        return bool(self.engines) and all(e.alive() for e in self.engines.values())

    def check(self) -> None:
        for e in self.engines.values():
            e.check()

    def engines_info(self) -> dict:
        return {name: {"url": f"{e.url}/v1", "command": e.command_line,
                       "serves": (f"full and {self.spec.setting.variant} (run-time switch)")
                       if e.spec.switchable else str(e.spec.setting.variant),
                       "start_s": round(e.start_s or 0, 2), "rss_mib": round(e.rss_bytes() / 2**20),
                       "log": str(e.log_path)} for name, e in self.engines.items()}

    def own_pids(self) -> list[int]:
        pids = [p for e in self.engines.values() for p in e.pids()]
        return pids + ([self.gen.proc.pid] if self.gen and self.gen.proc else [])

    def bench(self, specs, rounds: int = 3, progress=None, on_row=None) -> list[dict]:
        """Load tests, full against the variant (against itself for a full-only session)."""
        with self._lock:
            if self.gen is None:
                self.gen = LoadGenerator(cache_dir() / "serving" / "loadgen.log").start()
            client = Client(self.gen, self.spec.name, self.spec.model_dir, self.own_pids)
            return serve_bench(self.target("full"), self.target(self.names[-1]), client, specs,
                               rounds=rounds, progress=progress, on_row=on_row)

    def generate(self, side: str, prompt: str, max_tokens: int = 64) -> dict:
        """One greedy chat completion from `side`, streamed: text, TTFT, decode tok/s."""
        with self._lock:
            self._switch(side)
            return self._generate(self._engine(side), side, prompt, max_tokens)

    def _generate(self, engine: Engine, side: str, prompt: str, max_tokens: int) -> dict:
        body = {"model": self.spec.name, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        req = urllib.request.Request(f"{engine.url}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        t0 = time.perf_counter()
        first = last = None
        parts, tokens = [], None
        try:
            with urllib.request.urlopen(req, timeout=GENERATE_TIMEOUT_S) as r:
                for raw in r:
                    line = raw.decode().strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                    for c in chunk.get("choices", []):
                        text = c.get("delta", {}).get("content")
                        if text:
                            last = time.perf_counter()
                            first = first or last
                            parts.append(text)
        except OSError as e:
            engine.check()
            raise ServingError(f"the {side} engine did not answer: {e}") from None
        ttft = (first or time.perf_counter()) - t0
        decode = (tokens - 1) / (last - first) if tokens and tokens > 1 and last > first else None
        return {"text": "".join(parts), "ttft_ms": round(ttft * 1e3, 1), "tokens": tokens,
                "decode_tokens_per_s": round(decode, 1) if decode else None}

    def stop(self) -> None:
        if self.gen is not None:
            self.gen.close()
            self.gen = None
        for e in self.engines.values():
            e.stop()

    def __enter__(self) -> "Serving":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _labelled(progress, name: str, index: int, count: int):
    """An engine's progress(done, total, message) as part of starting `count` engines."""
    if progress is None:
        return None

    def show(done, total, message):
        progress(index * total + done, count * total, f"{name} engine: {message}")
    return show
