"""Parts of the Drift page: the curves of one run, the stored-run picker, runs A and B side by side."""
import datetime

import streamlit as st

from dashboard.charts import drift as drift_charts
from dashboard.panels import presenter, widgets
from dashboard.session import cached, state
from pop_analysis.engine.skipset import describe
from pop_analysis.experiments.paper import PAPER_DRIFT
from pop_analysis.inspection import drift as dr


def curves_of(res, only: bool, y_range=None, title=None):
    kw = {"title": title} if title else {}
    return drift_charts.drift_panels(res.to_dict(), res.skip_layers, only, y_range, PAPER_DRIFT, **kw)


def departures(res) -> None:
    """Beside the curves: this run against the paper's values, and why a small model differs."""
    means = res.block_means()
    attn, hidden = means.get("attn_out_cos"), means.get("hidden_cos")
    if attn is None:
        return
    paper = PAPER_DRIFT["attn_out"][0]
    if attn >= paper:
        st.success(f"Attention output over the skipped block: {attn:.2f}, at or above the "
                   f"paper's {paper:.2f}: attention absorbs the K/V drift here as the paper says.")
        return
    st.info(f"**Where this run departs from the paper.** The attention output of decode steps "
            f"averages {attn:.2f} over the skipped block (hidden states {hidden:.2f}); the paper "
            f"(Qwen3-VL-8B, 36 layers) keeps it above {paper:.2f}. {res.model}'s "
            f"{res.n_layers} layers have less depth redundancy than an 8B model's: its deep "
            "layers still change the hidden state a lot (see the Calibrate page's prefill "
            "importance), so the K/V they project from the shallower state differ more, and "
            "attention's averaging no longer hides it. Try fewer skipped layers (Skip set page) "
            "and measure again to see how it moves.", icon=":material/science:")


def _label(e) -> str:
    p = e["params"]
    when = datetime.datetime.fromtimestamp(e["saved_at"]).strftime("%Y-%m-%d %H:%M")
    return (f"{p.get('model')} · {p.get('prompt_tokens')} prompt tokens · skip "
            f"{describe(p.get('skip') or [])} · {p.get('config', {}).get('decode_steps')} steps · {when}")


def stored_runs() -> None:
    """An expander listing stored drift runs; a button shows the chosen one as run A or B."""
    stored = cached.stored_entries(dr.KIND)
    if not stored:
        return
    with st.expander(f"Stored drift runs ({len(stored)}): show as A or B"):
        by_key = {e["key"]: e for e in stored}
        pick = st.selectbox("Stored run", list(by_key), format_func=lambda k: _label(by_key[k]),
                            key="drift.stored")
        a, b = st.columns(2)
        for col, target, name in ((a, state.DRIFT, "A"), (b, state.DRIFT_B, "B")):
            if col.button(f"Show as {name}", key=f"drift.load.{name}"):
                loaded = cached.load_result(dr.KIND, pick, dr.DriftResult)
                if loaded is not None:
                    state.keep_result(target, loaded, {"stored": _label(by_key[pick])})
                    st.rerun()


def side_by_side(res, res_b, figures: dict) -> None:
    """Runs A and B on one y axis, and a table of both runs' block means."""
    st.subheader("Side by side: A (current) and B (pinned)")
    shared = drift_charts.drift_range(res.to_dict(), res_b.to_dict())
    cols = st.columns(2)
    for col, r, name, key in ((cols[0], res, "A", state.DRIFT), (cols[1], res_b, "B", state.DRIFT_B)):
        with col:
            figures[f"curves_{name}"] = curves_of(r, True, shared, f"{name}: skipped "
                                                  f"{describe(r.skip_layers)}, {r.prompt_tokens} tokens")
            presenter.plot(figures[f"curves_{name}"], key=f"drift.cmp.{name}")
            widgets.made_from(key)
    table = [{"run": name, "prompt tokens": r.prompt_tokens, "skip set": describe(r.skip_layers),
              **{drift_charts.COSINE_NAMES[q]: r.block_means()[f"{q}_cos"] for q in drift_charts.COSINES},
              "mean KL (nats)": sum(r.kl) / len(r.kl) if r.kl else None}
             for name, r in (("A", res), ("B", res_b))]
    widgets.table(table, hide_index=True, key="drift.cmp.table",
                  column_config={c: st.column_config.NumberColumn(format="%.3f")
                                 for c in list(table[0])[3:]})
    st.caption("Means over each run's skipped block; the two charts share one y axis.")
    st.button("Clear B", key="drift.unpin", on_click=lambda: st.session_state.pop(state.DRIFT_B, None))
