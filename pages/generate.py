"""Generate: the full model and a POP variant answer the same prompt, side by side."""
import html

import streamlit as st
import torch

from dashboard.charts import generate as generate_charts
from dashboard.charts import layers as layer_charts
from dashboard.panels import exports, generate_lens, generate_speed, kv_repair, widgets
from pop_analysis.data.example_prompts import EXAMPLES
from dashboard.panels.generate_stream import (
    agreement,
    output_html,
    readable_text,
    stream_variant,
    token_pieces,
)
from dashboard.session import state
from dashboard.session.resources import warmed_up
from pop_analysis.engine.generate import SamplingConfig, encode
from pop_analysis.engine.skipset import Preset, SkipSetError, describe, preset, validate
from pop_analysis.errors import first_line
from pop_vllm.variants import Variant

V, P = Variant, Preset  # the shallow and interleaved rows are POP on the preset's skip set
VARIANTS = {V.POP: "POP (independent KV + boundary)", V.POP_NO_KV: "ablation: without independent KV",
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
prompt = st.text_area("Prompt", key=state.kept("gen.prompt", ""), height=140,
                      placeholder="Type a prompt or pick an example")
c = st.columns([2, 1, 1, 1])
offered = [v for v in VARIANTS if v != "pop_repair" or kv_repair.stored_key(lm, skip)]
variant = c[0].selectbox("Compare the full model with", offered, format_func=VARIANTS.get,
                         key=state.kept("gen.variant", "pop", offered),
                         help="pop_repair appears once a K/V repair is stored for this skip set "
                              "(Skip set page)")
mode = c[1].radio("Decoding", ("greedy", "sampling"), key=state.kept("gen.mode", "greedy"),
                  horizontal=True)
max_new = c[2].number_input("New tokens", 1, 512, key=state.kept("gen.max_new", 32))
raw = widgets.raw_box(c[3], lm, "gen.raw")
temperature, top_p, seed = 0.0, 1.0, 0
if mode == "sampling":
    s = st.columns(3)
    temperature = s[0].slider("Temperature", 0.05, 2.0, key=state.kept("gen.temp", 0.7))
    top_p = s[1].slider("Top-p", 0.05, 1.0, key=state.kept("gen.top_p", 0.9))
    seed = s[2].number_input("Seed", 0, 2**31 - 1, key=state.kept("gen.seed", 0))
cfg = SamplingConfig(max_new_tokens=int(max_new), temperature=temperature, top_p=top_p, seed=int(seed))
run_skip = preset(variant, n) if variant in ("shallow", "interleaved") else skip
st.caption(f"Skipped in prefill: layers {describe(run_skip)} ({len(run_skip)}/{n}); "
           "same seed for both runs when sampling.")
now = {"prompt": prompt, "variant": SHORT[variant], "skip set": describe(run_skip),
       "decoding": mode if mode == "greedy" else f"sampling (T {temperature}, top-p {top_p}, seed {seed})",
       "new tokens": int(max_new), "raw": raw}
clicked = st.button("Generate", type="primary", key="gen.go")

left, right = st.columns(2)
left.markdown("**Full model**")
right.markdown(f"**{VARIANTS[variant]}**")
out = {"full": left.container(key="gen-out-full").empty(),
       "other": right.container(key="gen-out-pop").empty()}


def live(where):
    return lambda ids: where.markdown(html.escape(readable_text(lm.tokenizer, ids))
                                      if lm.tokenizer else ids)


if clicked:
    try:
        ids = encode(lm, prompt or "", raw=raw)
        validate(run_skip, n)
        engine = "pop" if variant in ("shallow", "interleaved") else variant
        with widgets.run_lock():
            warmed_up(*state.model_spec().key)
            if engine == "pop_repair":
                kv_repair.use_stored(lm, run_skip)  # the newest stored maps for this skip set
            full = stream_variant(lm, ids, "full", (), cfg, live(out["full"]))
            other = stream_variant(lm, ids, engine, run_skip, cfg, live(out["other"]))
        measured = generate_speed.measure(lm, state.model_spec().key, ids, engine, run_skip)
        state.keep_result(state.GENERATION, {
            "prompt_tokens": len(ids), "full": full, "other": other, "label": VARIANTS[variant],
            "short": SHORT[variant], "prompt_ids": ids, "engine": engine, "speed": measured,
            "full_text": readable_text(lm.tokenizer, full["token_ids"]) if lm.tokenizer else "",
            "other_text": readable_text(lm.tokenizer, other["token_ids"]) if lm.tokenizer else ""},
            now)
    except torch.OutOfMemoryError:
        st.error("Out of memory: try fewer new tokens, a shorter prompt or a smaller model.")
    except (ValueError, SkipSetError, RuntimeError) as e:
        st.error(f"Generation failed: {first_line(e)}")

res = st.session_state.get(state.GENERATION)
if res:
    full, other, name = res["full"], res["other"], res.get("short", "variant")
    share, first = agreement(full["token_ids"], other["token_ids"])
    out["full"].markdown(output_html(lm.tokenizer, full["token_ids"], first), unsafe_allow_html=True)
    out["other"].markdown(output_html(lm.tokenizer, other["token_ids"], first), unsafe_allow_html=True)
    widgets.made_from(state.GENERATION, now, "Generate")
    if res.get("speed") is not None and "prompt_ids" in res:
        if st.button("Re-measure speed", key="gen.remeasure",
                     help="Run the timing protocol again on the same prompt"):
            try:
                res["speed"] = generate_speed.measure(lm, state.model_spec().key, res["prompt_ids"],
                                             res["engine"], other["skip"])
            except (ValueError, RuntimeError) as e:
                st.error(f"Re-measuring failed: {first_line(e)}")
        generate_speed.show(res["speed"], name=name)
    m = st.columns(2)
    m[0].metric(f"Decode tok/s (full / {name})",
                " / ".join(f"{r['decode_tok_s']:.1f}" if r["decode_tok_s"] else "–" for r in (full, other)))
    m[1].metric("Token agreement", f"{share:.0%}",
                "identical" if first is None else f"first divergence at token {first}", delta_color="off")
    st.caption(f"Prompt: {res['prompt_tokens']} tokens. A yellow mark is the first token where "
               "the two outputs differ; grey text follows it. The token arrival chart below is "
               "the streamed run, one each.")
    figures = {"arrival": generate_charts.arrival_chart({"full": full["times"], name: other["times"]})}
    st.plotly_chart(figures["arrival"], key="gen.arrival")

    generate_lens.explain(lm, res, name, first, figures)

    st.subheader("What ran: calls per layer and stage")
    st.caption("Skipped layers show 0 attention/FFN calls in prefill but one k_proj call (the "
               "independent K/V projection). x_N (boundary) runs every layer: those below the "
               "first skipped layer within the prompt's pass (their inputs are identical in "
               "both paths, so the result is exact), the rest in the boundary step. Decode runs "
               "every layer.")
    for r, title in ((full, "full model"), (other, res["label"])):
        figures[f"calls_{r['variant']}"] = layer_charts.call_counts_heatmap(r["counts"], f"Calls: {title}")
        st.plotly_chart(figures[f"calls_{r['variant']}"], key=f"gen.counts.{r['variant']}.{title}")
    tokens = [{"step": i, "full": a, name: b} for i, (a, b) in enumerate(
        zip(token_pieces(lm.tokenizer, full["token_ids"]), token_pieces(lm.tokenizer, other["token_ids"])))]
    exports.offer("generation", data={k: v for k, v in res.items() if k not in ("speed", "lens")}
                  | {"speed": res.get("speed"), "made_from": state.context_of(state.GENERATION)},
                  rows=tokens, figures=figures)
