"""Prompt precision beside the skip set: the sidebar box, the Skip set page's section (layers to
int8, the plan per layer, the memory of the int8 copies) and the measured frontier."""
from __future__ import annotations

import streamlit as st

from dashboard.charts import style
from dashboard.charts.precision import frontier_chart
from dashboard.panels import presenter
from dashboard.session import state
from dashboard.session.precision_state import int8_for, set_int8
from pop_analysis.engine.precision import Configuration, Precision, layer_plan, plan_code
from pop_analysis.engine.skipset import describe
from pop_analysis.speed.machine import int8_isa
from pop_vllm.run_setting import RunSetting, SettingError

INT8_COLOUR = style.INT8
BOX = "w.int8"  # the sidebar's int8 box (synced from the shared set every run)
ERROR = "lab.int8_error"  # the last refused input, shown where it was typed
PILLS = "precision.pills"
POINTS = "lab.precision_points"  # {model: (points, frontier names)} of the last measurement
PROMPTS = 8  # built-in prompts the dashboard's frontier scores quality on
TOKENS = 32  # the prompt length its TTFT is timed at (short prompts: where precision could help)


def _apply(layers, n: int, skip, where: str) -> None:
    try:
        set_int8(layers, n, skip)
        st.session_state.pop(ERROR, None)
    except SettingError as e:
        st.session_state[ERROR] = (where, str(e))


def _on_box(n: int, skip) -> None:
    from dashboard.session.links import parse_skip

    try:
        layers = parse_skip(st.session_state[BOX])
    except SettingError as e:
        st.session_state[ERROR] = ("sidebar", str(e))
        return
    _apply(layers, n, skip, "sidebar")


def _error(where_now: str, container) -> None:
    where, text = st.session_state.get(ERROR, (None, None))
    if where == where_now:
        st.session_state.pop(ERROR, None)
        container.error(f"Int8 layers unchanged: {text}")


def sidebar_box(lm, skip, where) -> None:
    """The shared int8 set as text ('0-19', 'none'), under the skip set's box."""
    from dashboard.session.links import skip_text

    n = lm.adapter.n_layers
    state.sync(BOX, skip_text(int8_for(n, skip)))
    where.text_input("Prompt int8 layers", key=BOX, on_change=_on_box, args=(n, skip),
                     help="layers whose prompt (x_1..x_{N-1}) runs in int8; x_N and decode stay "
                          "fp32. '0-19', 'none'; a skipped layer cannot also be int8")
    _error("sidebar", where)


def section(lm, skip) -> None:
    """The Skip set page's precision section."""
    from pop_analysis.engine.int8 import memory, unavailable_reason

    n = lm.adapter.n_layers
    st.subheader("Prompt precision (int8)")
    st.caption("Each layer reads the prompt in full fp32, in int8 (int8 weights, int8 activations "
               "per token) or is skipped. x_N and every generated token run all layers in fp32 "
               "from the original weights: decode is the full model's given the prompt's cache.")
    reason = unavailable_reason(lm.adapter)
    if reason:
        st.info(f"No int8 path here: {reason}")
        return
    int8 = int8_for(n, skip)
    kept = [i for i in range(n) if i not in skip]
    state.sync(PILLS, list(int8))
    st.pills("Int8 layers (of the kept ones)", options=kept, selection_mode="multi", key=PILLS,
             on_change=lambda: _apply(st.session_state[PILLS] or (), n, skip, "page"))
    cols = st.columns(2)
    cols[0].button("All kept layers in int8", key="precision.all", width="stretch",
                   on_click=_apply, args=(kept, n, skip, "page"))
    cols[1].button("None in int8", key="precision.none", width="stretch",
                   on_click=_apply, args=((), n, skip, "page"))
    _error("page", st)
    plan = plan_code(layer_plan(n, _current(skip, int8)))
    st.markdown(f"Per layer (F full, I int8, S skipped): `{plan}` · int8 {describe(int8)}")
    _frontier(lm, skip, int8)
    mem = memory(lm.adapter)
    if mem["int8_layers"]:
        st.caption(f"{mem['int8_layers']} int8 layer copies built so far: "
                   f"{mem['int8_bytes'] / 2**20:.1f} MiB beside the {mem['model_bytes'] / 2**20:.0f}"
                   f" MiB fp32 model ({mem['extra_share']:.0%}).")


def _configs(n: int, skip, int8) -> list[Configuration]:
    from pop_analysis.experiments.precision_frontier import FULL_CONFIG, standard

    out = [FULL_CONFIG, *standard(n)]
    if int8 or skip:
        out.append(Configuration("current", _current(skip, int8)))
    return out


def _current(skip, int8) -> RunSetting:
    """The shared skip set and int8 layers as one setting (POP when something is skipped)."""
    return RunSetting(skip, "pop" if skip else "full", precision=Precision(tuple(int8)))


def _frontier(lm, skip, int8) -> None:
    from pop_analysis.data.prompts import load_prompts
    from pop_analysis.experiments.precision_frontier import frontier, measure_points
    from pop_analysis.quality.evalsets import load_eval_set
    from pop_analysis.speed.bench import random_prompt

    st.markdown("**The frontier**: each configuration's TTFT speedup over the full model "
                f"({TOKENS} tokens, the timing protocol) against its continuation KL to the "
                f"full model ({PROMPTS} built-in prompts).")
    n = lm.adapter.n_layers
    if st.button("Measure the frontier", key="precision.measure"):
        configs = _configs(n, skip, int8)
        bar = st.progress(0.0, text="measuring")
        items = load_eval_set(lm, "builtin", PROMPTS).items
        points = measure_points(lm, configs, items, random_prompt(lm, TOKENS),
                                on_config=lambda k, t: bar.progress(k / t, text=f"{k}/{t}"))
        st.session_state.setdefault(POINTS, {})[lm.name] = (
            points, [p.name for p in frontier(points)])
    got = st.session_state.get(POINTS, {}).get(lm.name)
    if got is None:
        st.caption(f"Not measured yet for this model (a few minutes on a 2-core CPU). {_int8_here()}")
        return
    points, names = got
    presenter.plot(frontier_chart(points, names, "current"), key="precision.frontier")
    if not all(p.trustworthy for p in points):
        st.caption("Hollow red markers: timings the protocol flagged (a busy machine or rounds "
                   "that disagree).")


def _int8_here() -> str:
    """What this CPU offers int8 products (the kernels' speed depends on it: docs/precision.md)."""
    isa = int8_isa()
    if isa:
        return (f"This CPU has {', '.join(isa)}: int8 products run about as fast as fp32 at short "
                "prompts and up to 2x faster from a few hundred tokens.")
    return ("This CPU has no AMX or VNNI int8 instructions: int8 layers run many times slower "
            "than fp32 here.")
