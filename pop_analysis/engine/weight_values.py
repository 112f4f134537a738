"""A checkpoint's tensors must be numbers the model can compute with: float types, finite values.

transformers casts whatever a checkpoint holds to the model's dtype without a word: int8 tensors
in place of float weights become garbage, and NaN or inf values load as they are; both generate
with exit code 0. Refused here with one line naming the first bad tensor:
- the stored dtype, from the safetensors header (or a .bin pickle mapped on the meta device), so
  nothing is read but the header; half precision (fp16, bf16) is a float type and is upcast;
- finiteness, in one pass over the tensors once they are in memory: the sum of a tensor is finite
  only when every value is (a NaN or inf propagates), so the pass is one reduction per tensor,
  with the element-wise test only where a sum of large finite values overflowed.
A quantized checkpoint (config.quantization_config) holds integer tensors by design: its dtypes
are not checked.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from pop_analysis.errors import first_line

INTEGER_TYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
                 "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64"}  # header names
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLE = ("model.safetensors", "pytorch_model.bin")


def checkpoint_files(folder: Path) -> list[Path]:
    """The weight files transformers (and vLLM) load from a model folder: the shards an index
    names, else the single file; safetensors first."""
    for index, single in zip(INDEXES, SINGLE):
        if (folder / index).is_file():
            try:
                shards = json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"]
                return sorted({folder / name for name in shards.values()})
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return []  # transformers reports the damaged index itself
        if (folder / single).is_file():
            return [folder / single]
    return []


def stored_dtypes(path: Path):
    """(tensor name, dtype name) per tensor of a weight file, its data left unread."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                dtype = f.get_slice(name).get_dtype()
                yield name, INTEGER_TYPES.get(dtype, dtype.lower())
        return
    state = torch.load(path, map_location="meta", weights_only=True, mmap=True)
    for name, t in state.items():
        yield name, str(t.dtype).removeprefix("torch.")


def integer_tensor(files, quantized: bool = False) -> str | None:
    """The first tensor stored with an integer type, as one phrase; None when all are floats."""
    if quantized:
        return None
    for path in files:
        for name, dtype in stored_dtypes(path):
            if dtype in INTEGER_TYPES.values():
                return (f"tensor {name} is stored as {dtype}, an integer type, where the model "
                        "has float parameters (the cast on loading would make the weights "
                        "garbage); save it as float32, float16 or bfloat16")
    return None


def finite(t: torch.Tensor) -> bool:
    """Whether every value of a float tensor is finite: one reduction, exact on overflow."""
    if not t.is_floating_point() or t.device.type == "meta":
        return True
    total = t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
    return bool(torch.isfinite(total)) or bool(torch.isfinite(t).all())


def nonfinite_tensor(named) -> str | None:
    """The first of (name, tensor) pairs holding a NaN or an infinity, as one phrase."""
    for name, t in named:
        if not finite(t):
            bad = int((~torch.isfinite(t)).sum())
            return (f"tensor {name} holds {bad} value{'s' if bad > 1 else ''} that "
                    f"{'are' if bad > 1 else 'is'} not finite (NaN or infinity) in "
                    f"{str(t.dtype).removeprefix('torch.')}")
    return None


def model_tensors(model):
    """(name, tensor) of every parameter and buffer, as in the state dict."""
    yield from model.named_parameters()
    yield from model.named_buffers()


def quantized(folder: Path) -> bool:
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and bool(cfg.get("quantization_config"))


def folder_problem(folder: str | Path) -> str | None:
    """Why a model folder's weights cannot be served, for an engine that loads the folder itself
    (the serving path); None only when the check ran to its end and found every tensor a finite
    float. It fails closed: no weight files, an index that cannot be read, or a file that cannot
    be read or parsed is a problem too, named in one phrase. A completed check is remembered per
    file version (path, size, mtime); a check that could not read a file is not, so the next
    start reads it again."""
    folder = Path(folder)
    files = checkpoint_files(folder)
    if not files:
        return _no_files(folder)
    stamp = tuple((str(p), *_version(p)) for p in files)
    if stamp in _checked:
        return _checked[stamp]
    try:
        bad = files_problem(folder, files)
    except Exception as e:  # noqa: BLE001 - unreadable: refused and said why, never passed
        return f"its weights cannot be read ({type(e).__name__}: {first_line(e)})"
    if len(_checked) >= CHECKED:
        _checked.pop(next(iter(_checked)))
    _checked[stamp] = bad
    return bad


def files_problem(folder: Path, files) -> str | None:
    """The check itself, every time (dtypes from the headers, then every tensor's values read
    through a memory map); a file it cannot read raises."""
    bad = integer_tensor(files, quantized(folder))
    return bad or next(filter(None, (nonfinite_tensor(_file_tensors(p)) for p in files)), None)


CHECKED = 16  # folder versions whose completed check is remembered
_checked: dict[tuple, str | None] = {}  # file versions -> the completed check's answer


def _no_files(folder: Path) -> str:
    """Why checkpoint_files found nothing: no weight file, or an index that cannot be read."""
    index = next((folder / i for i in INDEXES if (folder / i).is_file()), None)
    if index is not None:
        return f"its shard index {index.name} cannot be read or names no shard"
    return f"it holds no weight file ({', '.join(SINGLE)} or a shard index)"


def _version(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return -1, -1
    return st.st_size, st.st_mtime_ns


def _file_tensors(path: Path):
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
        return
    yield from torch.load(path, map_location="cpu", weights_only=True, mmap=True).items()
