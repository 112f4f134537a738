"""The Generate page's result: both outputs, one speed story, agreement with what the paper
reports beside it, the decode pace, the logit lens and the per-layer call counts."""
from __future__ import annotations

import streamlit as st

from dashboard.charts import generate as generate_charts
from dashboard.charts import layers as layer_charts
from dashboard.panels import exports, generate_lens, generate_speed, presenter, widgets
from dashboard.panels.generate_text import heal_line, output_html, repeats, token_pieces
from dashboard.session import classmode, state
from pop_analysis.engine.models import LoadedModel
from pop_analysis.errors import first_line
from pop_analysis.quality.metrics import agreement
from pop_vllm.run_setting import RunSetting

# What the paper reports at 8B (POP_METHOD.md §7): accuracy within a few points of the full model.
PAPER_NOTE = ("The paper reports POP within 1-3 accuracy points of the full model on 8B-12B "
              "models (Llama-3.1-8B GSM8K 79.7 → 77.3).")


def show(lm: LoadedModel, res: dict, now: dict, out: dict) -> None:
    """Draw a kept generation of the loaded model (`out`: the two output slots)."""
    if res.get("model", lm.name) != lm.name:  # never drawn through another model's tokenizer
        st.info(f"The last generation was made with {res['model']}; load it to see it again.")
        return
    full, other, name = res["full"], res["other"], res.get("short", "variant")
    ag = agreement(full["token_ids"], other["token_ids"])
    share, first = ag.match_rate, ag.first_divergence
    out["full"].markdown(output_html(lm.tokenizer, full["token_ids"], first), unsafe_allow_html=True)
    out["other"].markdown(output_html(lm.tokenizer, other["token_ids"], first), unsafe_allow_html=True)
    widgets.made_from(state.GENERATION, now, "Generate")
    classmode.offer_back("generation", lm.name, lm.adapter.n_layers)
    if res.get("speed") is not None and "prompt_ids" in res:
        if st.button("Re-measure speed", key="gen.remeasure",
                     help="Run the timing protocol again on the same prompt"):
            try:
                setting = RunSetting(other["skip"], res["engine"])
                res["speed"] = generate_speed.measure(lm, state.model_spec().key, res["prompt_ids"],
                                                      setting)
            except (ValueError, RuntimeError) as e:
                st.error(f"Re-measuring failed: {first_line(e)}")
        generate_speed.show(res["speed"], name=name)
    departures(lm, full, other, share, first, name)
    if heal_line(other.get("heal")):
        st.info(heal_line(other["heal"]), icon=":material/healing:")
    figures = {"decode_pace": generate_charts.arrival_chart({"full": full["times"],
                                                             name: other["times"]})}
    presenter.plot(figures["decode_pace"], key="gen.arrival")
    st.caption(f"Prompt: {res['prompt_tokens']} tokens. Decode runs every layer in both models, "
               "so the two lines run parallel up to the noise of one streamed run each. The time "
               "to the first token is the measured TTFT above.")
    generate_lens.explain(lm, res, name, first, figures)
    if not state.presenting():
        counts(res, figures)
    tokens = [{"step": i, "full": a, name: b} for i, (a, b) in enumerate(
        zip(token_pieces(lm.tokenizer, full["token_ids"]), token_pieces(lm.tokenizer, other["token_ids"])))]
    exports.offer("generation", data={k: v for k, v in res.items() if k not in ("speed", "lens")}
                  | {"speed": res["speed"].to_dict() if res.get("speed") else None,
                     "made_from": state.context_of(state.GENERATION)},
                  rows=tokens, figures=figures)


def departures(lm: LoadedModel, full: dict, other: dict, share: float, first, name: str) -> None:
    """Token agreement and one decode speed, each with where this model departs from the paper."""
    m = st.columns(2)
    rates = [r["decode_tok_s"] for r in (full, other) if r["decode_tok_s"]]
    m[0].metric("Decode tok/s (the same layers in both)",
                f"{sum(rates) / len(rates):.1f}" if rates else "–",
                " / ".join(f"{r:.1f}" for r in rates) + f" (full / {name}, one streamed run each)"
                if len(rates) == 2 else None, delta_color="off", delta_arrow="off")
    m[1].metric("Token agreement", f"{share:.0%}",
                "identical" if first is None else f"first divergence at token {first}",
                delta_color="off")
    loop = repeats(other["token_ids"])
    if first is not None and share < 0.9:
        st.info(f"**Where POP departs from the paper here.** {name} agrees with the full model on "
                f"{share:.0%} of the tokens of this answer. {PAPER_NOTE} A "
                f"{lm.adapter.n_layers}-layer model of this size has less depth to spare: its "
                "deep layers still matter for reading the prompt (see Calibrate), so pruning "
                "them in prefill moves the cache more. "
                + ("Its answer also falls into a loop (a phrase repeated), a known failure of a "
                   "cache that has drifted. " if loop else "")
                + "The Sweeps page measures this over many items, with intervals.",
                icon=":material/science:")


def counts(res: dict, figures: dict) -> None:
    st.subheader("What ran: calls per layer and stage")
    st.caption("Skipped layers show 0 attention/FFN calls in prefill but one k_proj call (the "
               "independent K/V projection). x_N (boundary) runs every layer: those below the "
               "first skipped layer within the prompt's pass (their inputs are identical in "
               "both paths, so the result is exact), the rest in the boundary step. Decode runs "
               "every layer.")
    for r, title in ((res["full"], "full model"), (res["other"], res["label"])):
        figures[f"calls_{r['variant']}"] = layer_charts.call_counts_heatmap(r["counts"], f"Calls: {title}")
        presenter.plot(figures[f"calls_{r['variant']}"], key=f"gen.counts.{r['variant']}.{title}")
