"""Generate: the full model and a POP variant answer the same prompt, side by side."""
import html

import streamlit as st
import torch

from dashboard.panels import generate_result, generate_speed, kv_repair, widgets
from dashboard.panels.generate_text import readable_text
from dashboard.session import state
from dashboard.session.resources import warmed_up
from pop_analysis.data.example_prompts import EXAMPLES
from pop_analysis.data.example_prompts import SHORT as DEFAULT_PROMPT
from pop_analysis.engine.generate import SamplingConfig, encode
from pop_analysis.engine.skipset import Preset, describe, preset
from pop_analysis.errors import first_line
from pop_analysis.inspection.side_by_side import run_variant
from pop_vllm.healing import HEALABLE
from pop_vllm.healing import make as make_heal
from pop_vllm.run_setting import RunSetting, SettingError
from pop_vllm.variants import Variant

V, P = Variant, Preset  # the shallow and interleaved rows are POP on the preset's skip set
LABELS = {V.POP: "POP (independent KV + boundary)", V.POP_NO_KV: "ablation: without independent KV",
            V.POP_NO_BOUNDARY: "ablation: without boundary handling",
            V.STATIC: "static: layers removed in prefill and decode", P.SHALLOW: "ablation: shallow block",
            P.INTERLEAVED: "ablation: interleaved layers", V.POP_REPAIR: kv_repair.LABEL}
SHORT = {V.POP: "POP", V.POP_NO_KV: "POP without KV", V.POP_NO_BOUNDARY: "POP without boundary",
         V.STATIC: "static", P.SHALLOW: "POP (shallow)", P.INTERLEAVED: "POP (interleaved)",
         V.POP_REPAIR: kv_repair.SHORT}

st.title("Generate: full vs POP")
lm = widgets.model_or_stop()
n = lm.adapter.n_layers
skip = state.skip_for(n)


def use_example() -> None:
    st.session_state["gen.prompt"] = EXAMPLES[st.session_state["gen.example"]]


st.selectbox("Example", list(EXAMPLES), key="gen.example", on_change=use_example, index=None,
             placeholder="pick an example (short or long) ...")
prompt = st.text_area("Prompt", key=state.kept("gen.prompt", DEFAULT_PROMPT), height=140,
                      placeholder="Type a prompt or pick an example")
c = st.columns([2, 1, 1, 1])
offered = [v for v in LABELS if v != "pop_repair" or kv_repair.stored_key(lm, skip)]
variant = c[0].selectbox("Compare the full model with", offered, format_func=LABELS.get,
                         key=state.kept("gen.variant", "pop", offered),
                         help="pop_repair appears once a K/V repair is stored for this skip set "
                              "(Skip set page)")
mode = c[1].radio("Decoding", ("greedy", "sampling"), key=state.kept("gen.mode", "greedy"),
                  horizontal=True)
max_new = widgets.number(c[2], "New tokens", 1, 512, key=state.kept("gen.max_new", 32))
raw = widgets.raw_box(c[3], lm, "gen.raw")
temperature, top_p, seed = 0.0, 1.0, 0
if mode == "sampling":
    s = st.columns(3)
    temperature = s[0].slider("Temperature", 0.05, 2.0, key=state.kept("gen.temp", 0.7))
    top_p = s[1].slider("Top-p", 0.05, 1.0, key=state.kept("gen.top_p", 0.9))
    seed = widgets.number(s[2], "Seed", 0, 2**31 - 1, key=state.kept("gen.seed", 0))
h = st.columns([2, 1, 1])
heal_policy, budget = widgets.heal_controls(h[0], h[1], "gen", 32, 65536,
                                            disabled=variant not in HEALABLE)
chunk = widgets.number(h[2], "Chunk (positions)", 1, 65536, key=state.kept("gen.heal_chunk", 64),
                       disabled=heal_policy == "none")
heal_policy = heal_policy if variant in HEALABLE else "none"
cfg = SamplingConfig(max_new_tokens=int(max_new), temperature=temperature, top_p=top_p, seed=int(seed))
run_skip = preset(variant, n) if variant in ("shallow", "interleaved") else skip
st.caption(f"Skipped in prefill: layers {describe(run_skip)} ({len(run_skip)}/{n}); "
           "same seed for both runs when sampling.")
now = {"prompt": prompt, "variant": SHORT[variant], "skip set": describe(run_skip),
       "decoding": mode if mode == "greedy" else f"sampling (T {temperature}, top-p {top_p}, seed {seed})",
       "new tokens": int(max_new), "raw": raw,
       "healing": widgets.heal_label(heal_policy, budget)}
clicked = st.button("Generate", type="primary", key="gen.go", disabled=not prompt.strip() or widgets.refused(),
                    help=None if prompt.strip() else "type a prompt or pick an example first")

left, right = st.columns(2)
left.markdown("**Full model**")
right.markdown(f"**{LABELS[variant]}**")
out = {"full": left.container(key="gen-out-full").empty(),
       "other": right.container(key="gen-out-pop").empty()}


def live(where):
    return lambda ids: where.markdown(html.escape(readable_text(lm.tokenizer, ids))
                                      if lm.tokenizer else ids)


if clicked:
    try:
        ids = encode(lm, prompt or "", raw=raw)
        heal = make_heal(heal_policy, int(chunk),
                         budget_positions=int(budget) if heal_policy == "budget" else None)
        engine = "pop" if variant in ("shallow", "interleaved") else variant
        setting = RunSetting(run_skip, engine, heal=heal).check(n)
        with widgets.run_lock():
            warmed_up(*state.model_spec().key)
            if engine == "pop_repair":
                kv_repair.use_stored(lm, run_skip)  # the newest stored maps for this skip set
            full = run_variant(lm, ids, RunSetting.full(), cfg, live(out["full"]))
            other = run_variant(lm, ids, setting, cfg, live(out["other"]))
        measured = generate_speed.measure(lm, state.model_spec().key, ids, setting)
        state.keep_result(state.GENERATION, {
            "model": lm.name, "prompt_tokens": len(ids), "full": full, "other": other,
            "label": LABELS[variant], "short": SHORT[variant], "prompt_ids": ids, "engine": engine,
            "speed": measured,
            "full_text": readable_text(lm.tokenizer, full["token_ids"]) if lm.tokenizer else "",
            "other_text": readable_text(lm.tokenizer, other["token_ids"]) if lm.tokenizer else ""},
            now)
    except torch.OutOfMemoryError:
        st.error("Out of memory: try fewer new tokens, a shorter prompt or a smaller model.")
    except (ValueError, SettingError, RuntimeError) as e:
        st.error(f"Generation failed: {first_line(e)}")

res = st.session_state.get(state.GENERATION)
if res:
    generate_result.show(lm, res, now, out)
