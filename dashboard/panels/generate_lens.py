"""The Generate page's logit-lens section: where POP's answer departs from the full model's."""
from __future__ import annotations

import streamlit as st

from dashboard.charts import generate as lens_charts
from dashboard.panels import presenter, widgets
from dashboard.panels.generate_text import token_pieces
from pop_analysis.engine.models import LoadedModel
from pop_analysis.errors import first_line
from pop_analysis.inspection import lens
from pop_vllm.run_setting import RunSetting


def explain(lm: LoadedModel, res: dict, name: str, first: int | None, figures: dict) -> None:
    """The lens button, then the commitment strip and the top-5 candidates at the first divergence."""
    full, other, n = res["full"], res["other"], lm.adapter.n_layers
    st.subheader("Where the answers part: the logit lens")
    st.caption("Each layer's hidden state read through the final norm and lm_head. A token's "
               "commitment layer is the layer from which it stays the top choice up to the "
               "output: POP's answer departs where its commitment or its candidates differ.")
    if "lens" not in res and st.button("Explain with the logit lens", key="gen.lens"):
        try:
            with widgets.run_lock(), st.spinner("Reading every layer through the lens ..."):
                setting = RunSetting(other["skip"], res["engine"])
                res["lens"] = {"full": lens.trace(lm, res["prompt_ids"], full["token_ids"]),
                               "other": lens.trace(lm, res["prompt_ids"], other["token_ids"],
                                                   setting)}
        except (ValueError, RuntimeError) as e:
            st.error(f"The lens failed: {first_line(e)}")
    if "lens" in res:
        tf, to = res["lens"]["full"], res["lens"]["other"]
        pieces = {k: token_pieces(lm.tokenizer, t.tokens) for k, t in (("f", tf), ("o", to))}
        figures["commitment"] = lens_charts.commitment_strip(
            [{"name": "full", "pieces": pieces["f"], "commit": tf.commit},
             {"name": name, "pieces": pieces["o"], "commit": to.commit}], n, first)
        presenter.plot(figures["commitment"], key="gen.commit")
        if first is not None and first < min(len(tf.topk), len(to.topk)):
            cands = [lens.top_candidates(lm, t, first) for t in (tf, to)]
            figures["top5"] = lens_charts.top_candidates(
                *cands, name, (pieces["f"][first], pieces["o"][first]))
            presenter.plot(figures["top5"], key="gen.top5")
        elif first is None:
            st.info("The two outputs are identical: there is no divergent token to explain.")
        if len(full["token_ids"]) > lens.MAX_TOKENS:
            st.caption(f"The lens covers the first {lens.MAX_TOKENS} tokens.")
