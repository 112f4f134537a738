"""Step through: one short prompt through the full model and POP, step by step, on the real model.

Keys: → next, ← previous, space play / pause (PageDown / PageUp change page). The step is in the
URL (?step=k), so a link opens the same frame.
"""
import streamlit as st

from dashboard.panels import exports, stepthrough_player, widgets
from dashboard.session import classmode, jobs, precision_state, state
from pop_analysis.data.example_prompts import STEP
from pop_analysis.engine.skipset import describe
from pop_analysis.errors import first_line
from pop_analysis.inspection import stepthrough as stp
from pop_analysis.progress import duration
from pop_vllm.healing import make as make_heal

st.title("Step through POP")
present = state.presenting()  # the grid and the clock on the first screen; the rest below them
if not present:
    st.markdown("A short prompt goes through the **full model** and through **POP**, step by "
                "step. Each step shows which layer ran what on which token, the K/V cells it "
                "wrote, its share of the FLOPs and its time on this machine; both models run on "
                "one clock. Everything drawn was recorded from a run of the loaded model (hooks "
                "on its own modules; a test holds the grid equal to the engine's call counters, "
                "which count the matmuls themselves).")

lm = widgets.model_or_stop()
n = lm.adapter.n_layers
skip = state.skip_for(n)
int8 = precision_state.int8_for(n, skip)  # layers whose prompt the POP run reads in int8

box = st.container(border=True) if not present else None
player = st.container()
box = box or st.expander("Record another prompt")  # the presenter's view: folded, below
with box:
    c = st.columns([4, 1], vertical_alignment="bottom")
    prompt = c[0].text_input("Prompt (2-48 tokens, no chat template; POP gains visibly from ~30)",
                             key=state.kept("step.prompt", STEP))
    h = st.columns([3, 2, 3], vertical_alignment="bottom")
    policy, budget = widgets.heal_controls(h[0], h[1], "step", stp.HEAL_BUDGET, stp.MAX_TOKENS)
    healing = widgets.heal_label(policy, budget)
    now = {"prompt": prompt, "skip set": describe(skip), "int8 layers": describe(int8),
           "healing": healing}
    go = c[1].button("Record this prompt", type="primary", key="step.go",
                     disabled=jobs.running("stepthrough") or not prompt.strip() or widgets.refused())
    st.caption(f"Skipped in POP's prefill: layers {describe(skip)} ({len(skip)}/{n}); prompt in "
               f"int8: {describe(int8)}; from the Skip set page or the sidebar. Healing: "
               f"{healing}. Recording runs each model once with hooks, then times both without "
               "hooks over 5 rounds.")
    if go:
        try:
            ids = stp.encode_short(lm, prompt)
            heal = make_heal(policy, budget_positions=int(budget) if policy == "budget" else None)
            cfg = stp.StepConfig(int8=int8, heal=heal)
            stp.run_settings(skip, cfg)["pop"].check(n)  # a refused combination: here, in one line
            jobs.start("stepthrough", "Recording the step-through", lambda p: stp.cached_stepthrough(
                lm, ids, skip, cfg, prompt, progress=p, notice=p.notice),
                lambda job: jobs.outcome(
                    job, state.STEPTHROUGH, "Step-through", "use a shorter prompt.",
                    lambda part: "nothing", lambda r: f"recorded in {duration(r.seconds)}"),
                context=now)
            st.session_state[stepthrough_player.STEP] = 0
        except ValueError as e:
            st.error(f"Step-through: {first_line(e)}")
    jobs.panel("stepthrough")

rec = st.session_state.get(state.STEPTHROUGH)
if rec is None:
    player.info("No step-through yet: record one above.")
    st.stop()
with player:
    heal = rec.config.get("heal") or {}  # records made before healing have none
    per_step = f" {heal['budget_positions']} positions per step" if heal.get("budget_positions") \
        else ""
    about = (f"{rec.model} · '{rec.prompt}' ({len(rec.prompt_ids)} tokens) · skipped "
             f"{describe(rec.skip_layers)}" + (f" · healing {heal['policy']}{per_step}" if heal.get(
                 "policy", "none") != "none" else ""))
    if not present:
        st.subheader(about)
        widgets.made_from(state.STEPTHROUGH, now, "Record this prompt")
    frames = stp.frames(rec.steps)
    i = stepthrough_player.current(len(frames))
    stepthrough_player.controls(i, len(frames), frames[i]["title"])
    figures = stepthrough_player.frame(rec, frames[i])
    if present:
        st.caption(about)
        widgets.made_from(state.STEPTHROUGH, now, "Record this prompt")
    back = st.columns(2)
    classmode.offer_back("stepthrough", lm.name, n, back[0])
    classmode.offer_back("heal_stepthrough", lm.name, n, back[1],
                         label="Show the stored healing example")
exports.offer("stepthrough", data=rec.to_dict(), figures=figures,
              rows=[{"run": s["run"], "stage": s["stage"], "time_ms": s["time_ms"],
                     "flops": s["flops"], "token": (s["token"] or [None, ""])[1]} for s in rec.steps])
