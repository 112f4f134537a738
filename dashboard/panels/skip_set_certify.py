"""The Skip set page's certified choice: a set with a finite-sample guarantee, searched on
selection items and certified on items the search never saw; the three splits, their sources
and sizes, checked disjoint where the user sets them."""
from __future__ import annotations

import streamlit as st

from dashboard.panels import exports
from dashboard.panels.methods_scores import _use
from dashboard.session import cached, jobs, state
from pop_analysis.engine.models import LoadedModel
from pop_analysis.engine.skipset import describe
from pop_analysis.errors import first_line
from pop_analysis.experiments import certify as cf
from pop_analysis.experiments.methods_run import ImportanceConfig, cached_importance
from pop_analysis.importance.methods import METHODS
from pop_analysis.importance.picks import SHAPES
from pop_analysis.progress import duration
from pop_analysis.quality.splits import make_splits

JOB = "certify"
DATA = "gsm8k"  # selection and certification items: GSM8K test questions (1319)


def section(lm: LoadedModel) -> None:
    n = lm.adapter.n_layers
    st.subheader("Certified choice")
    st.caption("The search runs on selection items only and fixes a nested sequence of sets; "
               "certification items, touched once, then test it smallest first and stop at the "
               "first failure. The last set that passes is certified: with the confidence shown, "
               "its share of bad items is at most α.")
    c = st.columns(4)
    alpha = c[0].number_input("α: bad items at most", 0.01, 0.99, step=0.01, format="%.2f",
                              key=state.kept("cert.alpha", 0.1))
    eps = c[0].number_input("ε: a bad item loses more than (nats/token)", 0.0, 10.0, step=0.01,
                            format="%.3f", key=state.kept("cert.eps", 0.1))
    delta = c[1].number_input("δ: wrong with probability at most", 0.001, 0.5, step=0.01,
                              format="%.3f", key=state.kept("cert.delta", 0.05))
    method = c[1].selectbox("Ranking of", list(METHODS), format_func=lambda m: METHODS[m].title,
                            key=state.kept("cert.method", "tail"))
    shape = c[1].radio("Shape", SHAPES, horizontal=True, key=state.kept("cert.shape", "free"))
    most = c[0].number_input("Longest sequence (sets)", 1, 200, key=state.kept("cert.most", 12),
                             help="the search stops after this many nested sets")
    rank_n = c[2].number_input("Prompts ranking the layers (built-in)", 1, 200,
                             key=state.kept("cert.rank_n", 8))
    sel_off = c[2].number_input("Selection: first GSM8K item", 0, 1318, key=state.kept("cert.sel_off", 0))
    sel_n = c[2].number_input("Selection items", 1, 1319, key=state.kept("cert.sel_n", 100))
    cer_off = c[3].number_input("Certification: first GSM8K item", 0, 1318,
                                key=state.kept("cert.cer_off", 100))
    cer_n = c[3].number_input("Certification items", 1, 1319, key=state.kept("cert.cer_n", 300))
    try:
        splits = make_splits(("builtin", int(rank_n)), (DATA, int(sel_off), int(sel_n)),
                             (DATA, int(cer_off), int(cer_n)))
    except ValueError as e:
        st.error(f"Cannot certify: {first_line(e)}")
        splits = None
    if splits:
        st.dataframe([{"split": s.role, "source": s.source, "items": f"{s.offset}-{s.offset + s.n - 1}",
                       "n": s.n, "fingerprint": s.fingerprint} for s in splits], hide_index=True)
    if st.button("Certify a set", type="primary", key="cert.go",
                 disabled=splits is None or jobs.running(JOB)):
        try:
            cfg = cf.CertifyConfig(alpha=alpha, epsilon=eps, delta=delta, method=method,
                                   shape=shape, max_sets=int(most))
        except ValueError as e:
            st.error(f"Cannot certify: {first_line(e)}")
        else:
            _start(lm, splits, cfg, ImportanceConfig(methods=(method,), n_samples=int(rank_n)))
    jobs.panel(JOB)
    show(n)


def _start(lm: LoadedModel, splits, cfg, rcfg) -> None:
    prompts = cached.prompt_set("builtin", None, rcfg.n_samples)

    def run(progress):
        ranking = cached_importance(lm, prompts, rcfg, True, progress, progress.notice)[0]
        return cf.cached_certify(lm, ranking, splits, cfg, True, progress, progress.notice)

    now = {"alpha": cfg.alpha, "epsilon": cfg.epsilon, "delta": cfg.delta,
           "method": METHODS[cfg.method].title, "shape": cfg.shape,
           "splits": ", ".join(f"{s.role} {s.n}" for s in splits)}
    jobs.start(JOB, f"Certifying a set (α = {cfg.alpha:g}, ε = {cfg.epsilon:g}, δ = {cfg.delta:g})",
               run, lambda job: jobs.outcome(job, state.CERTIFICATE, "Certified choice",
                                             "use fewer items.", lambda p: "the sets tested",
                                             lambda r: f"{len(r.sequence)} set(s) in "
                                                       f"{duration(sum(r.seconds.values()))}"),
               context=now)


def show(n: int) -> None:
    res = st.session_state.get(state.CERTIFICATE)
    if res is None:
        return
    (st.success if res.met else st.warning)(res.statement[:1].upper() + res.statement[1:] + ".")
    st.markdown(f"{res.note}.  \nMean ΔNLL of layers {res.estimate['set']} on the certification "
                f"items: {res.estimate['delta_nll']:+.3f} [{res.estimate['ci'][0]:+.3f}, "
                f"{res.estimate['ci'][1]:+.3f}] ({res.estimate['kind']}).")
    st.caption(f"Not covered: {res.not_covered}")
    st.dataframe([{"split": s["role"], "source": s["source"], "n": s["n"],
                   "fingerprint": s["fingerprint"]} for s in res.splits], hide_index=True)
    st.button(f"Use this set: layers {describe(res.certified)}", key="cert.use",
              disabled=not res.met or res.n_layers != n,
              on_click=_use, args=(res.certified, n, "certified choice"))
    rows = [{k: c.get(k) for k in ("set", "k", "selection_rate", "selection_delta", "tested",
                                   "bad", "n", "rate", "upper", "passed")} for c in res.sequence]
    st.dataframe(rows, hide_index=True)
    exports.offer("certified_choice", data=res.to_dict(), rows=rows)
