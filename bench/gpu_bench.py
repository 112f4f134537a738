"""TTFT of the full model vs POP, batch 1 and 8, beside the paper's Table 2 (A100, batch 8).

Models: the embedded SmolLM2-135M, and randomly initialised models shaped like Llama-3.1-8B and
Gemma-3-12B (text), built from configs in code on the device (weights do not change timing;
nothing is downloaded). Each model is first checked against HF's own forward on the same device
and dtype, then timed with the project's timing protocol (pop_analysis.speed.timing through
pop_analysis.speed.bench: CUDA-synchronised, full and POP alternated with the order swapped every round,
median of the per-round ratios with their IQR, noisy results flagged), beside the FLOP and
roofline ideals (the device's matmul rate and bandwidth are measured once and cached). Writes <out>/gpu_bench.json after every row and a plot <out>/gpu_bench.html (plus a
PNG when matplotlib is installed).

    python bench/gpu_bench.py                 # on a CUDA GPU, bf16, the paper's shapes
    python bench/gpu_bench.py --quick         # tiny shapes, any device (CPU: fp32)
"""
from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from pop_analysis.engine.generate import synchronize
from pop_analysis.engine.models import load_model, model_from_hf, parse_dtype
from pop_analysis.engine.pop import left_pad, run_prompt
from pop_analysis.engine.skipset import last_block
from pop_analysis.experiments.paper import table2_speedups
from pop_analysis.speed.bench import bench_length
from pop_analysis.speed.timing import TimingConfig
from pop_vllm.run_setting import RunSetting

from bench_results import RawFile

# The paper's Table 2: prefill (TTFT) speedup of POP, A100, batch 8; keyed like Spec.name.
PAPER_TABLE2 = {model.lower(): row for model, row in table2_speedups().items()}


@dataclass(frozen=True)
class Spec:
    """One benchmarked model."""

    name: str  # row label; matches PAPER_TABLE2 keys where the paper has numbers
    kind: str  # "embedded" | "llama" | "gemma3"
    sizes: dict  # config fields (random models only)
    n_skip: int | None  # skipped deep layers; None = the last third


LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                rope_theta=500000.0, tie_word_embeddings=False)
GEMMA3_12B = dict(vocab_size=262208, hidden_size=3840, intermediate_size=15360,
                  num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                  sliding_window=1024, query_pre_attn_scalar=256, max_position_embeddings=131072,
                  tie_word_embeddings=True)
# --quick: the same structures scaled down (Gemma keeps 5 local : 1 global and a window the
# longer prompts cross).
LLAMA_TINY = dict(vocab_size=4096, hidden_size=256, intermediate_size=896, num_hidden_layers=12,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
                  tie_word_embeddings=False)
GEMMA3_TINY = dict(vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=12,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=64,
                   query_pre_attn_scalar=64, max_position_embeddings=4096, tie_word_embeddings=True)

FULL_SPECS = [Spec("smollm2-135m", "embedded", {}, None),
              Spec("llama-3.1-8b", "llama", LLAMA_8B, 10),  # the paper skips 10 of 32
              Spec("gemma-3-12b", "gemma3", GEMMA3_12B, 16)]  # and 16 of 48
QUICK_SPECS = [Spec("smollm2-135m", "embedded", {}, None),
               Spec("llama-3.1-8b (tiny shape)", "llama", LLAMA_TINY, None),
               Spec("gemma-3-12b (tiny shape)", "gemma3", GEMMA3_TINY, None)]


def build(spec: Spec, device: str, dtype: torch.dtype):
    """A LoadedModel on `device`: the embedded model, or random weights from a config."""
    if spec.kind == "embedded":
        return load_model("smollm2-135m", device=device, dtype=str(dtype).replace("torch.", ""))
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig

    common = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config = (LlamaConfig if spec.kind == "llama" else Gemma3TextConfig)(**spec.sizes, **common)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):  # initialise on the device: an 8B model in seconds, no CPU copy
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model_from_hf(model.eval(), name=spec.name)


@torch.inference_mode()
def check(lm, dtype: torch.dtype) -> dict:
    """Our full path and POP with no skip vs HF's forward, on a left-padded batch of two."""
    vocab = lm.adapter.shape.vocab
    g = torch.Generator().manual_seed(1)
    window = max([w for w in lm.adapter.windows if w] or [16])
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (window + 8, 17)]
    ids, mask = left_pad(prompts, device=lm.device)  # (2, N) each; N crosses a sliding window
    ref = lm.model(input_ids=ids, attention_mask=mask).logits[:, -1].float()  # (2, V)
    out = {}
    for variant in ("full", "pop"):
        setting = RunSetting((), variant)
        ours = run_prompt(lm.adapter, ids, setting, attention_mask=mask).logits  # (2, V)
        rel = ((ours - ref).abs().max() / ref.abs().max()).item()
        out[variant] = {"max_rel_diff": round(rel, 6),
                        "top1_agree": bool((ours.argmax(-1) == ref.argmax(-1)).all())}
    skip = last_block(lm.adapter.n_layers, 1 / 3)
    pop = run_prompt(lm.adapter, ids, RunSetting(skip), attention_mask=mask).logits  # (2, V)
    out["pop_last_third_finite"] = bool(torch.isfinite(pop).all())
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    out["ok"] = all(out[v]["max_rel_diff"] < tol for v in ("full", "pop")) and bool(
        torch.isfinite(ref).all()) and out["pop_last_third_finite"]
    out["tolerance"] = tol
    return out


def run_spec(spec: Spec, args, device: str, dtype: torch.dtype, report: dict, save) -> None:
    t0 = time.perf_counter()
    lm = build(spec, device, dtype)
    n = lm.adapter.n_layers
    skip = tuple(range(n - spec.n_skip, n)) if spec.n_skip else last_block(n, 1 / 3)
    entry = {"model": spec.name, "layers": n, "skip_layers": list(skip),
             "parameters": sum(p.numel() for p in lm.model.parameters()),
             "build_s": round(time.perf_counter() - t0, 2), "check": check(lm, dtype), "rows": []}
    report["models"].append(entry)
    save()
    if not entry["check"]["ok"]:
        print(f"{spec.name}: correctness check FAILED {entry['check']}", file=sys.stderr)
        return
    for batch in args.batches:
        for length in args.lengths:
            if time.perf_counter() - report["_t0"] > args.max_seconds:
                entry["rows"].append({"batch": batch, "length": length, "skipped": "time budget"})
                continue
            cfg = TimingConfig(min_rounds=args.repeats, budget_s=args.timing_budget)
            row = bench_length(lm, length, skip, cfg, batch=batch).as_dict()
            row["batch"] = batch
            row["paper_speedup_batch8"] = PAPER_TABLE2.get(spec.name, {}).get(length)
            entry["rows"].append(row)
            save()
            lo, hi = row["speedup_range"]
            flag = "" if row["timing_trustworthy"] else f"  FLAGGED: {row['timing_note']}"
            print(f"{spec.name:>28} b={batch} n={length:>5}: full {row['ttft_full_ms']:9.2f} ms"
                  f"  pop {row['ttft_pop_ms']:9.2f} ms  speedup {row['speedup']:.2f}x"
                  f" [IQR {lo:.2f}-{hi:.2f}, {row['timing_rounds']} rounds]"
                  f" (ideal {row['ideal_speedup']:.2f}x FLOPs, {row['roofline_speedup']:.2f}x"
                  f" roofline){flag}", flush=True)
    del lm
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def plot(report: dict, out: Path) -> list[str]:  # out: the run's raw output path, no suffix
    """Speedup vs prompt length per model (batch 1 and 8), the paper's batch-8 values beside."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    models = report["models"]
    fig = make_subplots(rows=1, cols=len(models), subplot_titles=[m["model"] for m in models])
    paper_shown = False
    for col, m in enumerate(models, start=1):
        for batch in sorted({r["batch"] for r in m["rows"] if "speedup" in r}):
            rows = [r for r in m["rows"] if r.get("batch") == batch and "speedup" in r]
            fig.add_trace(go.Scatter(
                x=[r["length"] for r in rows], y=[r["speedup"] for r in rows], mode="lines+markers",
                name=f"POP batch {batch}", legendgroup=f"b{batch}", showlegend=col == 1,
                customdata=[[r["ttft_full_ms"], r["ttft_pop_ms"]] for r in rows],
                hovertemplate="%{x} tokens: %{y:.2f}x<br>full %{customdata[0]:.1f} ms, "
                              "POP %{customdata[1]:.1f} ms"), row=1, col=col)
        paper = PAPER_TABLE2.get(m["model"])
        if paper:
            fig.add_trace(go.Scatter(x=list(paper), y=list(paper.values()), mode="markers",
                                     marker_symbol="x", marker_size=10,
                                     name="paper, batch 8 (A100)",
                                     legendgroup="paper", showlegend=not paper_shown),
                          row=1, col=col)
            paper_shown = True
        fig.update_xaxes(type="log", title_text="prompt tokens", row=1, col=col)
    fig.update_yaxes(title_text="TTFT speedup (full / POP)", row=1, col=1)
    fig.update_layout(title=f"POP TTFT speedup on {report['device']} ({report['dtype']})",
                      height=420, width=420 * max(1, len(models)))
    html = out.parent / f"{out.name}.html"
    fig.write_html(html, include_plotlyjs=True)  # self-contained: viewable offline
    written = [str(html)]
    png = _png(report, out)
    if png:
        written.append(png)
    return written


def _png(report: dict, out: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    models = report["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.6), squeeze=False)
    for ax, m in zip(axes[0], models):
        for batch in sorted({r["batch"] for r in m["rows"] if "speedup" in r}):
            rows = [r for r in m["rows"] if r.get("batch") == batch and "speedup" in r]
            ax.plot([r["length"] for r in rows], [r["speedup"] for r in rows], "o-",
                    label=f"POP batch {batch}")
        paper = PAPER_TABLE2.get(m["model"])
        if paper:
            ax.plot(list(paper), list(paper.values()), "kx", label="paper, batch 8")
        ax.set_xscale("log")
        ax.set_title(m["model"], fontsize=9)
        ax.set_xlabel("prompt tokens")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("TTFT speedup")
    fig.tight_layout()
    path = out.parent / f"{out.name}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes, short prompts (any device)")
    p.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    p.add_argument("--dtype", default=None, help="bf16 on CUDA, fp32 on CPU unless given")
    p.add_argument("--lengths", default=None,
                   help="comma list (default 32,128,512,2048; quick 32,128)")
    p.add_argument("--batches", default="1,8", help="comma list of batch sizes")
    p.add_argument("--repeats", type=int, default=None,
                   help="fewest timed rounds (default 5; quick 3; the protocol runs at least 3)")
    p.add_argument("--timing-budget", type=float, default=None,
                   help="seconds of timed rounds per row (default 5; quick 1)")
    p.add_argument("--models", default=None, help="comma list of model names to run (default all)")
    p.add_argument("--max-seconds", type=float, default=1e9, help="skip rows after this long")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (reported)")
    args = p.parse_args(argv)
    args.lengths = [int(x) for x in (args.lengths or ("32,128" if args.quick else
                                                     "32,128,512,2048")).split(",")]
    args.batches = [int(x) for x in args.batches.split(",")]
    args.repeats = args.repeats or (3 if args.quick else 5)
    args.timing_budget = args.timing_budget or (1.0 if args.quick else 5.0)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch sees no CUDA device")
    if not device.startswith("cuda") and not args.quick:
        raise SystemExit("the paper's shapes (8B, 12B) need a CUDA GPU; on CPU use --quick")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = parse_dtype(args.dtype, device)
    specs = QUICK_SPECS if args.quick else FULL_SPECS
    if args.models:
        want = {m.strip() for m in args.models.split(",")}
        specs = [s for s in specs if s.name.split(" ")[0] in want]
    report = {"device": torch.cuda.get_device_name(0) if device.startswith("cuda") else
              f"cpu ({platform.processor() or platform.machine()})",
              "dtype": str(dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
              "quick": args.quick, "torch": torch.__version__,
              "transformers": __import__("transformers").__version__,
              "repeats": args.repeats, "paper_table2": PAPER_TABLE2, "models": [],
              "_t0": time.perf_counter()}
    raw = RawFile("gpu_bench", args)  # a new file per run, named by its parameters
    path = raw.path

    def save():
        raw.write({k: v for k, v in report.items() if k != "_t0"})

    for spec in specs:
        run_spec(spec, args, device, dtype, report, save)
    synchronize(device)
    report["wall_s"] = round(time.perf_counter() - report["_t0"], 1)
    save()
    print("wrote", path, *plot(report, path.parent / path.stem))
    return 0 if all(m["check"]["ok"] for m in report["models"]) else 1


if __name__ == "__main__":
    sys.exit(main())
