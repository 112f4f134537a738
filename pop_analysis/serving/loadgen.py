"""A bounded load test through vLLM's own benchmark code (vllm.benchmarks.serve, the code behind
`vllm bench serve`), run in the serving venv and driven over a pipe.

The benchmark runs offline: random prompts of exactly `input_len` tokens from the model's local
tokenizer, `output_len` tokens each (EOS ignored), Poisson arrivals at `request_rate` (or all at
once), optionally capped at `max_concurrency` requests in flight. Its per-request record (TTFT,
inter-token latencies, end-to-end latency) comes back as JSON. One driver process serves every run
of a session, so the ~10 s it takes to import vLLM is paid once, not per round.
"""
from __future__ import annotations

import json
import math
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from pop_analysis.serving import venv
from pop_analysis.serving.server import engine_env, EngineSpec
from pop_analysis.serving.venv import ServingError

MAX_PROMPTS = 512
MAX_OUTPUT = 1024
# Runs in the serving venv: one line of benchmark arguments in, one line of outcome out (the
# benchmark's own report goes to stderr, the log).
DRIVER = """
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
out, sys.stdout = sys.stdout, sys.stderr
for line in sys.stdin:
    p = FlexibleArgumentParser()
    add_cli_args(p)
    try:
        main(p.parse_args(json.loads(line)))
        out.write(json.dumps({"ok": True}) + "\\n")
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        out.write(json.dumps({"error": (type(e).__name__ + ": " + str(e)).splitlines()[0]}) + "\\n")
    out.flush()
"""


@dataclass(frozen=True)
class LoadSpec:
    """One bounded load test."""

    num_prompts: int = 32
    input_len: int = 1024  # prompt tokens per request
    output_len: int = 64  # generated tokens per request
    request_rate: float = math.inf  # requests per second (Poisson); inf: all at once
    max_concurrency: int | None = None  # requests in flight at most (None: no cap)
    seed: int = 0
    dataset: str | None = None  # a JSONL of {"prompt"} sent in order (chats); None: random
    extra_body: str | None = None  # JSON merged into every request (e.g. kv_transfer_params)

    def check(self, max_model_len: int) -> "LoadSpec":
        if not 1 <= self.num_prompts <= MAX_PROMPTS:
            raise ServingError(f"the number of requests must lie in 1..{MAX_PROMPTS}, got {self.num_prompts}")
        if not 2 <= self.output_len <= MAX_OUTPUT:
            raise ServingError(f"output tokens must lie in 2..{MAX_OUTPUT}, got {self.output_len}")
        if not 1 <= self.input_len <= max_model_len - self.output_len:
            raise ServingError(f"prompt tokens must lie in 1..{max_model_len - self.output_len} "
                               f"(the engine's {max_model_len} minus the output), got {self.input_len}")
        if not self.request_rate > 0:
            raise ServingError(f"the request rate must be positive (inf: all at once), got {self.request_rate}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ServingError(f"max concurrency must be at least 1, got {self.max_concurrency}")
        return self

    def describe(self) -> str:
        rate = "all at once" if math.isinf(self.request_rate) else f"{self.request_rate:g} req/s"
        cap = f", at most {self.max_concurrency} in flight" if self.max_concurrency else ""
        return f"{self.num_prompts} requests of {self.input_len} + {self.output_len} tokens, {rate}{cap}"


@dataclass
class LoadResult:
    """What one load test measured; times in milliseconds, one entry per successful request."""

    ttft_ms: list[float]
    tpot_ms: list[float]  # (latency - TTFT) / (output tokens - 1)
    latency_ms: list[float]
    duration_s: float
    completed: int
    failed: int
    output_throughput: float  # generated tokens per second over the run
    request_throughput: float
    errors: list[str] = field(default_factory=list)

    def quantile(self, name: str, q: float) -> float:
        return float(np.quantile(getattr(self, name), q))

    def to_dict(self) -> dict:
        return asdict(self)


def parse_result(raw: dict) -> LoadResult:
    """The benchmark's saved JSON (--save-detailed) -> LoadResult."""
    rows = [(t, lat, n) for t, lat, n, err in zip(raw["ttfts"], raw["latencies"],
                                                   raw["output_lens"], raw["errors"])
            if not err and n > 0]
    return LoadResult(
        ttft_ms=[t * 1e3 for t, _, _ in rows],
        tpot_ms=[(lat - t) * 1e3 / (n - 1) for t, lat, n in rows if n > 1],
        latency_ms=[lat * 1e3 for _, lat, _ in rows],
        duration_s=float(raw["duration"]), completed=int(raw["completed"]),
        failed=int(raw.get("failed", 0)), output_throughput=float(raw["output_throughput"]),
        request_throughput=float(raw["request_throughput"]),
        errors=sorted({e.strip().splitlines()[0][:200] for e in raw["errors"] if e}))


def bench_args(url: str, model: str, tokenizer: str, spec: LoadSpec, out: Path) -> list[str]:
    data = (["--dataset-name", "random", "--random-input-len", str(spec.input_len),
             "--random-output-len", str(spec.output_len), "--random-range-ratio", "0"]
            if spec.dataset is None else
            ["--dataset-name", "custom", "--dataset-path", spec.dataset, "--custom-output-len",
             str(spec.output_len), "--disable-shuffle", "--skip-chat-template"])
    args = ["--backend", "vllm", "--base-url", url, "--model", model, "--tokenizer", tokenizer,
            *data, "--num-prompts", str(spec.num_prompts), "--request-rate", str(spec.request_rate),
            "--seed", str(spec.seed), "--ignore-eos", "--temperature", "0", "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", str(out.parent),
            "--result-filename", out.name]
    if spec.max_concurrency:
        args += ["--max-concurrency", str(spec.max_concurrency)]
    if spec.extra_body:
        args += ["--extra-body", spec.extra_body]
    return args


class LoadGenerator:
    """The benchmark driver process; run() one load test at a time against a server URL."""

    def __init__(self, log_path: Path):
        self.log_path = Path(log_path)
        self.tmp = tempfile.TemporaryDirectory(prefix="poplab-load-")
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    def start(self) -> "LoadGenerator":
        python = str(venv.python())
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        env = engine_env(EngineSpec(model_dir="", name=""))
        self.proc = subprocess.Popen([python, "-c", DRIVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, env=env, text=True)
        return self

    def run(self, url: str, model: str, tokenizer: str, spec: LoadSpec) -> LoadResult:
        if self.proc is None:
            self.start()
        self.runs += 1
        out = Path(self.tmp.name) / f"run{self.runs}.json"
        self.proc.stdin.write(json.dumps(bench_args(url, model, tokenizer, spec, out)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()  # blocks until the run ends (or the driver dies)
        if not line:
            raise ServingError(f"the load generator exited (code {self.proc.wait()}): "
                               f"{_last_line(self.log_path)}")
        reply = json.loads(line)
        if "error" in reply:
            raise ServingError(f"the load test failed: {reply['error']}")
        result = parse_result(json.loads(out.read_text()))
        if result.completed == 0:
            raise ServingError(f"every request failed: {'; '.join(result.errors) or 'no reason given'}")
        return result

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()  # the driver's loop ends at end of input
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            self._log.close()
        self.tmp.cleanup()

    def __enter__(self) -> "LoadGenerator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][:300] if lines else "(the log is empty)"
