"""The Drift page's healing section: run POP with healing and watch each layer's K/V drift on the
prompt positions fall to 0 as the healed prefix grows (docs/healing.md)."""
from __future__ import annotations

import streamlit as st

from dashboard.charts import drift as drift_charts
from dashboard.panels import presenter, widgets
from dashboard.session import classmode, state
from pop_analysis.engine.generate import encode
from pop_analysis.engine.skipset import describe
from pop_analysis.errors import first_line
from pop_analysis.inspection.heal_drift import cached_healing_drift
from pop_vllm.healing import make
from pop_vllm.run_setting import RunSetting

KEY = state.HEAL_DRIFT
ACTION = "Heal and measure"


def section(lm, skip, prompt: str, raw: bool, figures: dict) -> None:
    st.subheader("Drift while healing")
    st.caption("Healing re-runs layers f..L-1 over the prompt between decode steps (Generate page, "
               "docs/healing.md). Each column is the cache after one more step: the prompt rows' "
               "drift from the full model's falls to 0, layer by layer, as the healed prefix grows.")
    c = st.columns(4, vertical_alignment="bottom")
    budget = widgets.number(c[0], "Positions per step", 2, 65536, key=state.kept("drift.heal_budget", 16))
    chunk = widgets.number(c[1], "Chunk", 1, 65536, key=state.kept("drift.heal_chunk", 16))
    steps = widgets.number(c[2], "New tokens", 2, 128, key=state.kept("drift.heal_steps", 12))
    now = {"prompt": prompt, "skip set": describe(skip), "positions per step": budget,
           "chunk": chunk, "new tokens": steps}
    if c[3].button(ACTION, key="drift.heal_go",
                   disabled=not prompt.strip() or widgets.refused()):
        try:
            ids = encode(lm, prompt, raw=raw)
            heal = make("budget", int(chunk), budget_positions=int(budget))
            with widgets.run_lock():
                setting = RunSetting(skip, heal=heal)
                got, _ = cached_healing_drift(lm, ids, setting, int(steps), notice=st.warning)
            state.keep_result(KEY, got.to_dict(), now)
        except ValueError as e:
            st.error(f"Healing drift failed: {first_line(e)}")
    res = st.session_state.get(KEY)
    if not res or res["model"] != lm.name:
        return
    widgets.made_from(KEY, now, ACTION)
    classmode.offer_back("heal_drift", lm.name, lm.adapter.n_layers)
    qty = st.radio("Drift of", ("v", "k"), horizontal=True, key=state.kept("drift.heal_qty", "v"),
                   format_func=drift_charts.COSINE_NAMES.get)
    figures["healing"] = drift_charts.healing_chart(res, qty)
    presenter.plot(figures["healing"], key="drift.heal_chart")
    h = res["heal"]
    st.caption(f"{res['prompt_tokens']} prompt tokens, budget {h['budget_positions']} positions "
               f"per step in chunks of {h['chunk']}: " + (
                   f"the cache was the full model's after {res['horizon']} tokens."
                   if res["horizon"] is not None else
                   f"the answer ended first ({res['healed'][-1]} positions healed)."))
