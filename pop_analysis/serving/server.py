"""Start and stop a local vLLM OpenAI-compatible server for one model directory and skip set.

The engine runs as `python -m vllm.entrypoints.openai.api_server` under the serving venv's Python
(the `vllm` console script of the CPU build asks for a distribution named `vllm` and fails),
listening on 127.0.0.1 only, with usage statistics off and every cache under the project's cache/.
It never outlives the process that started it:
- it is started through watchdog.py as the leader of a new process group, so stop() ends the
  front end, the engine core and its workers together;
- an atexit hook stops every engine still running when this interpreter exits;
- the watchdog ends the group when this process disappears without running atexit (SIGKILL).

`variant="full"` is stock vLLM; any other variant selects the POP plugin (pop_vllm/) through
`--hf-overrides` (see pop_overrides()). Every engine runs behind the plugin's guard
(`--middleware`): the run-time switch and any route that changes the engine answer only the secret
this process hands it in its environment (control.py).
"""
from __future__ import annotations

import atexit
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pop_analysis.serving import control, venv
from pop_analysis.serving.venv import ServingError
from pop_analysis.speed import procs
from pop_analysis.store.paths import cache_dir
from pop_vllm import engine_env as plugin_env
from pop_vllm import settings
from pop_vllm.run_setting import RunSetting

HOST = "127.0.0.1"
WATCHDOG = Path(__file__).with_name("watchdog.py")
START_TIMEOUT_S = 600.0  # a cold start on 2 shared cores took 28 s; compiled mode takes longer
MAX_START_TIMEOUT_S = 86400.0  # the longest wait for a start accepted (a day)
POLL_S = 0.5  # readiness polls (each one is a wait on the engine's exit, so a crash ends it)
STOP_TIMEOUT_S = 20.0
SECRET_SHOWN = f"${control.CONTROL_TOKEN_ENV}"  # what command_line shows: the shell's own, never ours
# What the log says while the engine starts, in order: (pattern, what the bar shows).
MILESTONES = (
    (r"non-default args", "reading the model config"),
    (r"Initializing a V1 LLM engine", "starting the engine core"),
    (r"Starting to load model", "loading the weights"),
    (r"Loading weights took", "allocating the KV cache"),
    (r"init engine .* took", "starting the HTTP front end"),
    (r"Application startup complete", "ready"),
)
# Log lines that explain an engine's death better than its last line does.
CAUSES = (
    (re.compile(r"Model architectures? \[?'?([\w.]+)'?\]? (?:are|is) not supported"),
     "model architecture {0} is not supported by this vLLM build"),
    (re.compile(r"No module named '?([\w.]+)'?"), "the serving venv is broken (no module {0}): "
     + venv.INSTALL_HINT.replace("build it", "rebuild it")),
    (re.compile(r"(?:Address already in use|address already in use)"),
     "the port was taken while the engine started; pick another port"),
)
ERROR_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception)\b|Value error)")
_RUNNING: set["Engine"] = set()  # engines this process started and has not stopped


@dataclass(frozen=True)
class EngineSpec:
    """What one engine serves and how."""

    model_dir: str  # a local directory with config.json, safetensors and a tokenizer
    name: str  # the model name clients send ("smollm2-135m")
    setting: RunSetting = RunSetting.full()  # what it serves: full is stock vLLM, else the plugin
    port: int = 0  # 0: a free port
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE, whole GiB (without it the KV cache took 21 GiB)
    max_model_len: int = 4096
    dtype: str = "float32"  # POP Lab's CPU dtype (vLLM would downcast to bfloat16)
    eager: bool = True  # --enforce-eager (compiled mode starts slower)
    switchable: bool = False  # POP engine whose sides are switched at run time (control.py)
    threads: int | None = None  # OMP threads of the worker (None: vLLM's choice)
    tensor_parallel: int = 1  # --tensor-parallel-size (ranks bound to their own cores)
    pipeline_parallel: int = 1  # --pipeline-parallel-size
    cpus: tuple[int, ...] = ()  # cores the whole engine is pinned to (() : not pinned)
    prefix_caching: bool = False  # vLLM's prefix cache (POP's block hashes carry its settings)
    extra_args: tuple[str, ...] = ()  # more vLLM flags (a KV transfer config, a block size)

    @property
    def pop(self) -> bool:
        return self.setting.variant != "full"


def architecture(model_dir: str) -> str:
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ServingError(f"{model_dir} has no readable config.json ({e})") from None
    return (cfg.get("architectures") or ["unknown"])[0]


def pop_overrides(spec: EngineSpec, arch: str) -> dict:
    """The --hf-overrides that select the plugin's Pop* model, its skip set and variant."""
    if not venv.has_plugin():
        raise ServingError(f"the POP plugin (pop_vllm) is not installed in {venv.venv_dir().name}: "
                           f"run `bash {venv.INSTALL_SCRIPT}`")
    try:
        return settings.overrides(arch, spec.setting)
    except settings.PopSettingsError as e:
        raise ServingError(f"{e}; serve it as variant full" if arch not in settings.ARCHITECTURES
                           else str(e)) from None


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def engine_env(spec: EngineSpec, secret: str | None = None) -> dict:
    """The environment of the engine: the plugin's engine environment (offline, no usage
    statistics, loopback, caches under cache/) over this process's own, with the control secret
    (the guard's; never vLLM's development routes). An engine pinned to cores (spec.cpus) splits
    them among its ranks."""
    ranks = spec.tensor_parallel * spec.pipeline_parallel
    try:
        world = plugin_env.engine_env(cache_dir(), spec.kv_cache_gib, spec.threads, ranks,
                                      spec.cpus)
    except ValueError as e:
        raise ServingError(str(e)) from None
    env = {**os.environ, **world, "PYTHONUNBUFFERED": "1"}
    for name in ("VIRTUAL_ENV", plugin_env.DEV_MODE_ENV, control.CONTROL_TOKEN_ENV):
        env.pop(name, None)
    if secret:
        env[control.CONTROL_TOKEN_ENV] = secret
    if spec.cpus:
        env.setdefault("OMP_NUM_THREADS", str(len(spec.cpus)))
    return env


def command(spec: EngineSpec, python: str, port: int) -> list[str]:
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model_dir,
           "--served-model-name", spec.name, "--host", HOST, "--port", str(port),
           "--max-model-len", str(spec.max_model_len), "--dtype", spec.dtype,
           "--disable-uvicorn-access-log"]
    if spec.eager:
        cmd.append("--enforce-eager")
    for flag, n in (("--tensor-parallel-size", spec.tensor_parallel),
                    ("--pipeline-parallel-size", spec.pipeline_parallel)):
        if n != 1:
            cmd += [flag, str(n)]
    cmd += ["--middleware", plugin_env.GUARD]
    if spec.pop:
        cmd += ["--hf-overrides", json.dumps(pop_overrides(spec, architecture(spec.model_dir)),
                                             separators=(",", ":"))]
    cmd += list(spec.extra_args)
    # Off unless asked for: a load test's repeated prompts would be served from the cache.
    cmd.append("--enable-prefix-caching" if spec.prefix_caching else "--no-enable-prefix-caching")
    return cmd


class Engine:
    """One vLLM server process group; start() blocks until it answers (bounded)."""

    def __init__(self, spec: EngineSpec, log_dir: Path | None = None):
        self.spec = spec
        self.log_dir = Path(log_dir or cache_dir() / "serving")
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.cmd: list[str] = []
        self.log_path: Path | None = None
        self.start_s: float | None = None  # seconds from launch to ready
        self._launched: tuple[float, float] = (0.0, START_TIMEOUT_S)  # (launch time, timeout)
        self._secret = control.new_secret()  # the control route's; in the engine's environment only
        self._lock = threading.Lock()

    milestones = MILESTONES  # what the log says while it starts (a proxy has its own)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def command_line(self) -> str:
        """The exact vLLM command (with the environment that matters), for a shell."""
        env = self._env()
        pre = [f"{k}={shlex.quote(env[k])}" for k in plugin_env.ENGINE_ENV_NAMES if k in env]
        pre.append(f"{control.CONTROL_TOKEN_ENV}=\"{SECRET_SHOWN}\"")  # the secret is never shown
        pin = ["taskset", "-c", ",".join(map(str, self.spec.cpus))] if self.spec.cpus else []
        return " ".join(pre + pin + [shlex.quote(c) for c in self.cmd])

    def start(self, progress=None, timeout_s: float = START_TIMEOUT_S) -> "Engine":
        """Launch and wait until /health answers. progress(done, total, message) follows the
        log's milestones. One-line ServingError when it cannot start."""
        return self.launch(timeout_s).wait_ready(progress)

    def launch(self, timeout_s: float = START_TIMEOUT_S) -> "Engine":
        """Start the process group and return at once; wait_ready() then waits for it, at most
        timeout_s from now. Engines launched one after another start side by side."""
        if not 0 < timeout_s <= MAX_START_TIMEOUT_S:  # a NaN never compares greater: no end
            raise ServingError(f"the start timeout must be a number of seconds in (0, "
                               f"{MAX_START_TIMEOUT_S:.0f}], got {timeout_s}")
        from pop_analysis.engine.weight_values import folder_problem  # torch: imported late

        bad = folder_problem(self.spec.model_dir)  # vLLM would cast and serve them as they are
        if bad:
            raise ServingError(f"the weights in {self.spec.model_dir} cannot be served: {bad}; the "
                               "engine was not started")
        python = str(venv.python())
        port = self.spec.port or free_port()
        if not port_free(port):
            raise ServingError(f"port {port} on {HOST} is in use; pick another port (0 = any free one)")
        self.port, self.cmd = port, self._command(python, port)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"engine-{port}.log"
        t0 = time.perf_counter()
        cpus = self.spec.cpus
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [python, str(WATCHDOG), str(os.getpid()), *self.cmd], env=self._env(),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=cache_dir(),
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        _RUNNING.add(self)
        self._launched = (t0, timeout_s)
        return self

    def wait_ready(self, progress=None) -> "Engine":
        """Block until the launched engine answers (stopping it when it cannot start)."""
        t0, timeout_s = self._launched
        try:
            self._wait_ready(progress, t0 + timeout_s, timeout_s)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.perf_counter() - t0
        return self

    def _command(self, python: str, port: int) -> list[str]:
        return command(self.spec, python, port)

    def _env(self) -> dict:
        return engine_env(self.spec, self._secret)

    def _wait_ready(self, progress, deadline: float, timeout_s: float) -> None:
        seen = 0
        while True:
            if self._healthy():
                if progress:
                    progress(len(self.milestones), len(self.milestones), "ready")
                return
            text = self.log_text()
            stages = self.milestones
            while seen < len(stages) and re.search(stages[seen][0], text):
                seen += 1
            if progress:
                progress(seen, len(stages), stages[max(seen - 1, 0)][1] if seen
                         else "starting Python and importing vLLM")
            if time.perf_counter() > deadline:
                raise ServingError(f"the engine did not answer within {timeout_s:.0f} s; "
                                   f"last log line: {self.last_log_line()}")
            try:
                self.proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                continue
            raise ServingError(f"the engine exited while starting: {self.cause()}")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def switch(self, setting: RunSetting) -> None:
        """The run-time switch of a switchable POP engine: the next steps run `setting` (the full
        model runs the stock forward; pop_repair needs its maps file). Every worker answers."""
        if not (self.spec.pop and self.spec.switchable):
            raise ServingError("this engine has no run-time switch (start it switchable)")
        got = self.control(plugin_env.SWITCH, [setting.as_config()])
        if not got or any(g.get("variant") != setting.variant for g in got):
            raise ServingError(f"the run-time switch answered {got!r:.200}, not variant "
                               f"{setting.variant}")

    def control(self, method: str, args=()) -> list:
        """A plugin worker method (pop_vllm.control) on every worker, through the guarded control
        route with this engine's secret; one-line ServingError when refused or dead."""
        try:
            return control.call(self.url, self._secret, method, args)
        except OSError as e:
            self.check()
            raise ServingError(f"the control call {method} failed: {e}") from None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self) -> None:
        """ServingError (one line, with the log's cause) when the engine has died."""
        if self.proc is not None and not self.alive():
            raise ServingError(f"the engine died (exit {self.proc.returncode}): {self.cause()}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to the process group, SIGKILL to what is left after timeout_s."""
        with self._lock:
            _RUNNING.discard(self)
            if self.proc is None:
                return
            pgid = self.proc.pid
            _signal_group(pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
            end = time.monotonic() + timeout_s
            while group_members(pgid) and time.monotonic() < end:
                _signal_group(pgid, signal.SIGKILL)
                time.sleep(0.1)  # the kernel reaps the group's members
            if self.proc.poll() is None:
                self.proc.wait(timeout=timeout_s)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""

    def last_log_line(self) -> str:
        lines = [ln.strip() for ln in self.log_text().splitlines() if ln.strip()
                 and "Route:" not in ln and "it/s]" not in ln]
        return lines[-1][:300] if lines else "(the log is empty)"

    def cause(self) -> str:
        """Why the engine stopped, in one line: a known cause from the log, else its last line."""
        text = self.log_text()
        for pattern, words in CAUSES:
            m = pattern.search(text)
            if m:
                return words.format(*m.groups())
        errors = [ln.strip() for ln in text.splitlines() if ERROR_LINE.match(ln)]
        if errors:
            return f"{errors[-1][:300]} (log: {self.log_path})"
        return f"last log line: {self.last_log_line()} (log: {self.log_path})"

    def rss_bytes(self) -> int:
        """Resident memory of the whole process group (front end, engine core, workers)."""
        return sum(map(procs.rss_bytes, group_members(self.proc.pid))) if self.proc else 0

    def pids(self) -> list[int]:
        return group_members(self.proc.pid) if self.proc else []

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group pgid, from /proc."""
    out = []
    for pid in procs.pids():
        fields = procs.stat_fields(pid)
        if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(pid)
    return out


def _signal_group(pgid: int, sig) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all() -> None:
    for engine in list(_RUNNING):
        engine.stop()


atexit.register(stop_all)
