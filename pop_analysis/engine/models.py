"""Model registry and loading: an embedded model, a hub id, or a local directory.

The embedded models (engine/embedded.py: SmolLM2-135M-Instruct, the default, and Gemma-3-270M)
ship as GGUF files in PyPI packages; each is de-quantised once by transformers' GGUF loader and
saved under cache/models/ as safetensors, one conversion at a time and renamed into place whole.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from pop_analysis.engine.adapter import DecoderAdapter, check_supported
from pop_analysis.engine.embedded import (DEFAULT_MODEL, REGISTRY, EmbeddedModel, PackageMissing,
                                          gguf_file)
from pop_analysis.engine.hub import unreachable_reason
from pop_analysis.engine.weight_values import (checkpoint_files, integer_tensor,
                                               model_tensors, nonfinite_tensor, quantized)
from pop_analysis.engine.weights_check import weight_problems
from pop_analysis.errors import first_line
from pop_analysis.store.paths import cache_dir

__all__ = ["DEFAULT_MODEL", "REGISTRY", "EmbeddedModel", "ModelLoadError", "LoadedModel",
           "convert_embedded", "converted_dir", "load_model", "model_from_hf", "resolve_source"]


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message says why in one line."""


@dataclass
class LoadedModel:
    """A causal LM ready for POP: the HF model, its tokenizer (may be None) and its adapter."""

    name: str  # what the user asked for
    model: torch.nn.Module
    tokenizer: object | None
    adapter: DecoderAdapter
    load_seconds: float  # wall time of the load, conversion included

    @property
    def device(self) -> torch.device:
        return self.adapter.device

    @property
    def dtype(self) -> torch.dtype:
        return self.adapter.base.embed_tokens.weight.dtype

    def card(self) -> dict:
        """Facts about the loaded model, for the dashboard and the CLI."""
        s = self.adapter.shape
        n_params = sum(p.numel() for p in self.model.parameters())
        return {
            "name": self.name,
            "architecture": (self.model.config.architectures or [type(self.model).__name__])[0],
            "model_type": self.model.config.model_type,
            "layers": s.n_layers,
            "heads": s.n_heads,
            "kv_heads": s.n_kv_heads,
            "hidden": s.hidden,
            "head_dim": s.head_dim,
            "intermediate": s.intermediate,
            "vocab": s.vocab,
            "context": s.max_positions,
            "parameters": n_params,
            "k_norm": self.adapter.has_k_norm,
            "tokenizer": self.tokenizer is not None,
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            **(REGISTRY[self.name].facts() if self.name in REGISTRY else {}),
        }


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> torch.dtype:
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def parse_dtype(name: str | None, device: str) -> torch.dtype:
    if name in (None, "", "auto"):
        return default_dtype(device)
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise ModelLoadError(f"unknown dtype {name!r}; choose one of {', '.join(table)}")
    return table[name]


def converted_dir(name: str) -> Path:
    return cache_dir() / "models" / name


def convert_embedded(name: str, convert=None) -> Path:
    """The converted model's directory, converting it first when needed; returns the directory.

    One conversion at a time (a file lock beside the target): a second process waits, then
    finds the finished model. The files are written to a fresh temporary folder beside the
    target and renamed into place whole, so a partial conversion is never used; a partial one
    that a killed run left behind is removed by the next conversion. `convert(entry, folder)`
    writes the model into `folder` (default: de-quantise the GGUF; tests inject a fast one).
    """
    out = converted_dir(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    with conversion_lock(out):
        if (out / "config.json").exists():
            return out  # another process converted it while this one waited
        for stale in out.parent.glob(f".{name}.partial-*"):  # the lock holder owns all partials
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{name}.partial-"))
        try:
            (convert or _convert_gguf)(REGISTRY[name], tmp)
            if out.exists():
                shutil.rmtree(out)  # a folder without config.json is no model
            os.replace(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


@contextmanager
def conversion_lock(out: Path):
    """An exclusive lock on cache/models/.<name>.lock; the OS drops it if the process dies."""
    with open(out.parent / f".{out.name}.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _convert_gguf(entry: EmbeddedModel, folder: Path) -> None:
    """De-quantise the entry's GGUF file and save it into `folder` as safetensors (and the
    tokenizer). An assembled GGUF is written to a sub-folder and removed once saved."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    scratch = folder / ".gguf"
    try:
        src = gguf_file(entry, scratch)
    except PackageMissing as e:
        raise ModelLoadError(str(e)) from None
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model.hf_quantizer = None  # a GGUF load carries a quantizer that save_pretrained refuses
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = [type(model).__name__]  # LlamaForCausalLM, Gemma3ForCausalLM
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    shutil.rmtree(scratch, ignore_errors=True)


def resolve_source(name: str) -> tuple[str, bool]:
    """Map a user's model name to (path or hub id, is_local)."""
    if name in REGISTRY:
        out = converted_dir(name)
        if not (out / "config.json").exists():
            out = convert_embedded(name)
        return str(out), True
    if os.path.isdir(os.path.expanduser(name)):
        return os.path.expanduser(name), True
    if os.path.exists(os.path.expanduser(name)):
        raise ModelLoadError(f"{name} is a file; give a model directory, a hub id or one of {list(REGISTRY)}")
    if name.count("/") != 1 or name.startswith(("/", ".")):
        raise ModelLoadError(
            f"unknown model {name!r}: not a registry name ({', '.join(REGISTRY)}), "
            "not a local directory and not a hub id of the form owner/name"
        )
    return name, False


def hub_fallback(name: str, source: str) -> bool:
    """Before any hub download: True (load from the local Hugging Face cache) when the hub is out
    of reach but the model is cached, False when the hub answers; one-line error otherwise."""
    reason = unreachable_reason()
    if reason is None:
        return False
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(source, "config.json"), str):
        return True
    raise ModelLoadError(f"model {name!r} needs the Hugging Face hub, which is out of reach "
                         f"({reason}), and is not in the local Hugging Face cache")


def load_config(source: str, local: bool, trust_remote_code: bool = False):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, local_files_only=local,
                                          trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - any failure here means "cannot load this model"
        where = "directory" if local else "hub id (is the network reachable?)"
        raise ModelLoadError(f"cannot read the config of model {source!r} as a {where}: "
                             f"{first_line(e)}") from None


def load_tokenizer(source: str, local: bool, trust_remote_code: bool = False):
    """The model's tokenizer, or None when it has none (token ids then in and out)."""
    from transformers import AutoTokenizer

    files = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
    if local and not any((Path(source) / f).exists() for f in files):
        return None  # transformers would otherwise build an empty tokenizer from the config
    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=local,
                                             trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - a model without a tokenizer is still usable
        return None


def load_model(name: str = DEFAULT_MODEL, device: str | None = None, dtype: str | None = None,
               trust_remote_code: bool = False, device_map=None) -> LoadedModel:
    """Load a supported causal LM for POP. Raises ModelLoadError with a one-line reason.

    device_map ("auto", "balanced", or a dict module name -> device) spreads the layers over
    several devices through accelerate, for models larger than one device; `device` then only
    picks the default dtype. The POP loop moves hidden states to each layer's device.
    """
    t0 = time.perf_counter()
    if device_map is not None:
        _check_accelerate()
    device = device or default_device()
    torch_dtype = parse_dtype(dtype, device)
    source, local = resolve_source(name)
    if not local:
        local = hub_fallback(name, source)
    config = load_config(source, local, trust_remote_code)
    from transformers import AutoModelForCausalLM
    try:
        check_supported(config)
    except ValueError as e:
        raise ModelLoadError(str(e)) from None
    checked = check_dtypes(name, source, local)  # before the weights are read and cast
    try:
        # Shapes that differ are reported (below), not raised as a multi-line table.
        model, info = AutoModelForCausalLM.from_pretrained(
            source, config=config, dtype=torch_dtype, local_files_only=local,
            trust_remote_code=trust_remote_code, device_map=device_map,
            output_loading_info=True, ignore_mismatched_sizes=True)
    except torch.OutOfMemoryError:
        raise ModelLoadError(f"out of memory loading {name} on {device} as {torch_dtype}") from None
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(f"cannot load weights of {name!r}: {first_line(e)}"
                             f"{damaged_hint(name)}") from None
    wrong = weight_problems(model, info)
    if wrong:
        raise ModelLoadError(f"the weights in {source} are not this model's: {'; '.join(wrong)}"
                             f"{damaged_hint(name)}")
    if not checked:
        check_dtypes(name, source, local)  # a hub model's files are in its cache only now
    bad = nonfinite_tensor(model_tensors(model))  # one reduction per tensor
    if bad:
        raise ModelLoadError(f"the weights in {source} are not numbers the model can use: "
                             f"{bad}{damaged_hint(name)}")
    if device_map is None:
        model.to(device)
    model.eval()
    tokenizer = load_tokenizer(source, local, trust_remote_code)
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, adapter=DecoderAdapter(model),
                       load_seconds=time.perf_counter() - t0)


def weights_folder(source: str, local: bool) -> Path | None:
    """The folder holding the weight files: the local directory, or a hub model's cached
    snapshot (None before its first download)."""
    if local and os.path.isdir(source):
        return Path(source)
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(source, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def check_dtypes(name: str, source: str, local: bool) -> bool:
    """Refuse integer tensors where the model has float parameters (headers only); False when
    no weight file was found to check."""
    folder = weights_folder(source, local)
    files = checkpoint_files(folder) if folder is not None else []
    try:
        bad = integer_tensor(files, quantized(folder)) if files else None
    except Exception:  # noqa: BLE001 - a damaged header: from_pretrained says what is wrong
        return False
    if bad:
        raise ModelLoadError(f"the weights in {source} are not numbers the model can use: "
                             f"{bad}{damaged_hint(name)}")
    return bool(files)


def damaged_hint(name: str) -> str:
    """For the embedded model, what to do when its converted copy is damaged (a truncated file
    fails the same way every time): delete the folder and it is converted again."""
    if name not in REGISTRY:
        return ""
    return f"; the converted copy looks damaged: delete {converted_dir(name)} and it is converted again"


def model_from_hf(model, tokenizer=None, name: str = "in-memory") -> LoadedModel:
    """Wrap an already built HF model (tests, notebooks)."""
    model.eval()
    return LoadedModel(name=name, model=model, tokenizer=tokenizer,
                       adapter=DecoderAdapter(model), load_seconds=0.0)


def _check_accelerate() -> None:
    try:
        import accelerate  # noqa: F401 - transformers needs it for device_map
    except ImportError:
        raise ModelLoadError("device_map needs the package accelerate "
                             "(pip install -r requirements.txt)") from None
