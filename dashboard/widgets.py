"""Reusable inputs and panels: the sidebar, the skip-set badge, progress bars, pickers."""
from __future__ import annotations

import hashlib
import html
import re
import threading
import time
from pathlib import Path

import streamlit as st

from dashboard import state
from dashboard.resources import load_log, locked, memory_in_use, shared_model, unload_models
from pop_analysis.allowed_paths import check_path
from pop_analysis.models import DEFAULT_MODEL, ModelLoadError
from pop_analysis.paths import cache_dir

SOURCES = {"Embedded (SmolLM2-135M, offline)": "embedded", "Hugging Face hub id": "hub",
           "Local directory": "local"}
DTYPES = ("auto", "float32", "bfloat16", "float16")


# ---------- model ----------

def _devices() -> list[str]:
    import torch

    return ["auto", "cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _spec_from_form(source: str, name: str, device: str, dtype: str) -> state.ModelSpec:
    if SOURCES[source] == "embedded":
        name = DEFAULT_MODEL
    name = name.strip()
    if not name:
        raise ModelLoadError("give a hub id (owner/name) or a local directory")
    if SOURCES[source] != "embedded":
        check_path(name)  # outside the allowed folders: refused unread (a hub id resolves in cwd)
    return state.ModelSpec(name, None if device == "auto" else device, None if dtype == "auto" else dtype)


def model_form() -> None:
    """Sidebar form: model source, name, device, dtype; loads on submit, errors shown here."""
    with st.sidebar.form("model_form", border=False):
        source = st.radio("Model", list(SOURCES), key="w.model_source")
        name = st.text_input("Hub id or directory", key="w.model_name",
                             placeholder="Qwen/Qwen3-0.6B or /path/to/model",
                             disabled=False, help="ignored for the embedded model")
        c1, c2 = st.columns(2)
        device = c1.selectbox("Device", _devices(), key="w.device")
        dtype = c2.selectbox("dtype", DTYPES, key="w.dtype")
        submitted = st.form_submit_button("Load model", width="stretch")
    if submitted:
        try:
            spec = _spec_from_form(source, name, device, dtype)
            with st.sidebar, st.spinner(f"Loading {spec.name} ..."):
                shared_model(*spec.key)
        except (ModelLoadError, ValueError, OSError, RuntimeError) as e:
            st.sidebar.error(f"Model not loaded: {e}")
            return
        state.set_model_spec(spec)
        st.session_state[state.UNLOADED] = False


def current_model():
    """The shared model of the session's spec, or None (unloaded / failed, message shown)."""
    if st.session_state.get(state.UNLOADED):
        return None
    spec = state.model_spec()
    try:
        with st.spinner(f"Loading {spec.name} ..."):
            return shared_model(*spec.key)
    except (ModelLoadError, ValueError, OSError, RuntimeError) as e:
        st.sidebar.error(f"Model not loaded: {e}")
        return None


def model_panel(lm) -> None:
    """Facts about the loaded model, memory in use, and the unload button."""
    side = st.sidebar
    if lm is None:
        side.info("No model loaded. Choose one above and press **Load model**.")
        return
    card = lm.card()
    loads = len(load_log())
    side.caption(f"**{card['name']}** · {card['layers']} layers · {card['device']} · {card['dtype']} · "
                 f"loaded in {lm.load_seconds:.1f} s · loads in this server: {loads}")
    mem = memory_in_use()
    text = f"Memory in use: {mem['process_rss_mib']:.0f} MiB (process)"
    if "cuda_allocated_mib" in mem:
        text += f", {mem['cuda_allocated_mib']:.0f} MiB on the GPU"
    side.caption(text)
    if side.button("Unload model", key="w.unload", help="free the memory (all sessions)"):
        unload_models()
        st.session_state[state.UNLOADED] = True
        st.rerun()


def model_or_stop():
    """For pages: the shared model, or a note and stop when none is loaded."""
    lm = current_model()
    if lm is None:
        st.info("No model is loaded. Load one in the sidebar to use this page.")
        st.stop()
    return lm


def run_lock():
    """The shared model's run lock (one run at a time across sessions)."""
    return locked(*state.model_spec().key,
                  on_wait=lambda: st.toast("Another session is using the model; waiting ..."))


# ---------- skip set ----------

def skip_badge(lm, where=None) -> None:
    """The current skip set, always visible: layers, share, ideal speedup, a mini strip."""
    from pop_analysis.flops import ideal_speedup
    from pop_analysis.skipset import describe

    where = where or st.sidebar
    n = lm.adapter.n_layers
    skip = state.skip_for(n)
    ideal = ideal_speedup(lm.adapter.shape, 512, skip)
    cells = "".join(
        f'<span title="layer {i}" style="display:inline-block;width:{max(2, 180 // n)}px;height:12px;'
        f'margin-right:1px;background:{"#f3b37a" if i in skip else "#cfe3f5"}"></span>'
        for i in range(n))
    where.markdown(f"**Skip set:** {html.escape(describe(skip))} "
                   f"({len(skip)}/{n} layers) · ideal prefill speedup {ideal:.2f}× at 512 tokens")
    where.markdown(f'<div data-testid="pop-skip-strip">{cells}</div>', unsafe_allow_html=True)


# ---------- progress ----------

class ProgressBar:
    """A st.progress bar fed by pop_analysis Progress updates, used as a context manager.

    The engines report at their own pace (a batch may take longer than 2 s on a busy CPU), so a
    heartbeat thread re-draws the bar with the wall-clock time every second: the page never looks
    frozen. `summary` says how often the engine itself reported.
    """

    HEARTBEAT_S = 1.0

    def __init__(self, label: str, where=st):
        self.label = label
        self.bar = where.progress(0.0, text=f"{label}: starting ...")
        self.t0 = time.perf_counter()
        self.times: list[float] = [self.t0]  # engine updates
        self.last = None  # the latest Progress
        self.drawn_at = self.t0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx

        ctx = get_script_run_ctx()
        if ctx is not None:
            self._thread = threading.Thread(target=self._beat, daemon=True)
            add_script_run_ctx(self._thread, ctx)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.bar.empty()
        return False

    def __call__(self, p) -> None:
        self.times.append(time.perf_counter())
        self.last = p
        self._draw()

    def _beat(self) -> None:
        while not self._stop.wait(self.HEARTBEAT_S / 4):
            if time.perf_counter() - self.drawn_at >= self.HEARTBEAT_S:
                self._draw()

    def _draw(self) -> None:
        with self._lock:
            if self._stop.is_set() and threading.current_thread() is self._thread:
                return
            p, wall = self.last, time.perf_counter() - self.t0
            frac = min(max(p.fraction, 0.0), 1.0) if p else 0.0
            text = f"{self.label}: {wall:.0f} s"
            if p is not None:
                eta = f" · ETA {p.eta_s:.0f} s" if p.eta_s is not None else ""
                text += f" · {p.done}/{p.total}{eta}" + (f" · {p.message}" if p.message else "")
            self.bar.progress(frac, text=text)
            self.drawn_at = time.perf_counter()

    @property
    def longest_gap_s(self) -> float:
        gaps = [b - a for a, b in zip(self.times, self.times[1:])]
        return max(gaps) if gaps else 0.0

    @property
    def summary(self) -> str:
        return (f"{len(self.times) - 1} engine progress updates, longest gap "
                f"{self.longest_gap_s:.1f} s (the bar refreshes every {self.HEARTBEAT_S:.0f} s)")


# ---------- data sets ----------

def dataset_picker(prefix: str):
    """Built-in, uploaded file, local path or HF data set -> (source, field, label) or None."""
    kind = st.radio("Prompts", ("built-in", "upload a file", "local path", "Hugging Face data set"),
                    horizontal=True, key=f"{prefix}.kind")
    if kind == "built-in":
        return "builtin", None, "built-in prompts"
    if kind == "upload a file":
        up = st.file_uploader("File (.jsonl, .json, .csv, .parquet, .txt)",
                              type=["jsonl", "json", "csv", "parquet", "txt"], key=f"{prefix}.upload")
        if up is None:
            return None
        try:
            path = save_upload(up.name, up.getvalue())
        except OSError as e:  # errors name the user's file, never the cache path
            st.error(f"Cannot keep the upload {up.name}: {e.strerror or 'write failed'}")
            return None
        return path, field_picker(path, prefix), up.name
    if kind == "local path":
        path = st.text_input("Path of a local file", key=f"{prefix}.path",
                             placeholder="/data/prompts.jsonl")
        if not path.strip():
            return None
        return path.strip(), field_picker(path.strip(), prefix), Path(path).name
    name = st.text_input("Data set (NAME[:split])", key=f"{prefix}.hf", placeholder="gsm8k:test")
    field = st.text_input("Field (empty = guess)", key=f"{prefix}.hf_field") or None
    return (f"hf:{name.strip()}", field, name.strip()) if name.strip() else None


def field_picker(path: str, prefix: str) -> str | None:
    from dashboard.data import peek_fields

    fields = peek_fields(path)
    if not fields:
        return None
    choice = st.selectbox("Field holding the prompt", ["(guess)"] + fields, key=f"{prefix}.field")
    return None if choice == "(guess)" else choice


def save_upload(name: str, data: bytes) -> str:
    """Keep an uploaded file as cache/uploads/<content hash>/<its own name> and return the path
    (the folder keeps equal names apart; the name is what errors and results show)."""
    own = Path(re.sub(r"[^\w.\- ]", "_", Path(name).name).lstrip(". ") or "upload")
    safe = own.stem[:80] + own.suffix[:10]
    path = cache_dir() / "uploads" / hashlib.sha256(data).hexdigest()[:16] / safe
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(path)
