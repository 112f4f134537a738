"""One self-contained HTML report of the session's current results, for teaching: the model and
skip set, then each result the session holds (calibration, generation, drift, sweep) with the
settings it came from, its figures (plotly.js inlined once: the file opens offline) and tables.

`snapshot()` reads the session in a script run; `build(snapshot)` is pure and runs when the
user clicks the download button (on another thread, where session state is out of reach).
"""
from __future__ import annotations

import datetime
import html

import streamlit as st

from dashboard.charts import calibrate as calibrate_charts
from dashboard.charts import drift as drift_charts
from dashboard.charts import methods as methods_charts
from dashboard.charts import stepthrough as step_charts
from dashboard.session import state
from pop_analysis.engine.skipset import describe
from pop_analysis.experiments.paper import PAPER_DRIFT
from pop_analysis.importance.methods import METHODS, primary

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
h1{margin-bottom:0}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .6em}
.note{color:#666;font-size:.9em}.out{white-space:pre-wrap;background:#f6f6f6;padding:.6em}"""


def snapshot() -> dict:
    """The session's current results, per model, and the settings they came from (references,
    no copies): one model's runs are never mixed into another's section."""
    return {"model": state.model_spec().name, "skip": st.session_state.get(state.SKIP),
            "models": state.results_by_model()}


def build(snap: dict) -> str:
    """The report as one HTML page: a section per model, the loaded one first."""
    parts = [f"<h1>POP Lab report</h1><p class=note>{datetime.datetime.now():%Y-%m-%d %H:%M} · "
             f"model {_e(snap['model'])} · skip set "
             f"{_e(describe(snap['skip'] or ()))}</p>"]
    js = [True]  # plotly.js goes into the first figure only

    def fig(f) -> str:
        out = f.to_html(full_html=False, include_plotlyjs=js[0])
        js[0] = False
        return out

    models = snap["models"]
    if not models:
        parts.append("<p>No results in this session yet: run a calibration, a generation, a "
                     "drift measurement or a sweep first.</p>")
    for model in sorted(models, key=lambda m: m != snap["model"]):
        parts.append(f"<h1 class=model>Model {_e(model)}</h1>")
        res = models[model]
        for key, section in SECTIONS:
            if key in res:
                result, ctx = res[key]
                parts.append(section(result, fig) + _context(ctx))
    return (f"<!doctype html><html><head><meta charset=utf-8><title>POP Lab report</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")


def _e(x) -> str:
    return html.escape(str(x))


def _context(ctx: dict | None) -> str:
    if not ctx:
        return ""
    if "example" in ctx:
        return f"<p class=note>{_e(ctx['example'])} (made by {_e(ctx.get('command', ''))})</p>"
    items = " · ".join(f"{_e(k)}: {_e(v)}" for k, v in ctx.items())
    return f"<p class=note>Made from: {items}</p>"


def _table(rows: list[dict], cols: list[str] | None = None) -> str:
    if not rows:
        return ""
    cols = cols or list(rows[0])
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_e(_fmt(r.get(c)))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return describe(v) if all(isinstance(i, int) for i in v) else ", ".join(map(str, v))
    return "" if v is None else str(v)


def _calibration(r, fig) -> str:
    from pop_analysis.quality.stats import mean_halfwidths  # scipy: only when a report is made

    return (f"<h2>Calibration: {_e(r.dataset)}, {r.n_samples} samples</h2>"
            "<p>Importance of each layer's virtual gate, separately for prefill and decode "
            "positions. Layers with low prefill importance are those POP can skip.</p>"
            + fig(calibrate_charts.importance_chart(
                r.prefill, r.decode, mean_halfwidths(r.prefill_std, r.n_samples),
                mean_halfwidths(r.decode_std, r.n_samples))))


def _generation(g, fig) -> str:
    full, other = g["full"], g["other"]
    return (f"<h2>Generation: full model vs {_e(g['label'])}</h2>"
            f"<p>Prompt: {g.get('prompt_tokens')} tokens.</p><h3>Full model</h3>"
            f"<div class=out>{_e(g.get('full_text', ''))}</div><h3>{_e(g['label'])}</h3>"
            f"<div class=out>{_e(g.get('other_text', ''))}</div>"
            + _table([{"run": name, "TTFT (ms)": r["ttft_s"] * 1e3, "new tokens": len(r["token_ids"]),
                       "decode tok/s": r.get("decode_tok_s")}
                      for name, r in (("full", full), (g["label"], other))])
            + _speed(g.get("speed")))


def _speed(p) -> str:
    """The timing protocol's prefill speedup beside the streamed TTFTs, flagged as on the page."""
    if p is None:
        return ""
    t = p.timing
    return (f"<p>Prefill speedup (timing protocol, {p.tokens} tokens, {t.rounds} rounds): "
            f"{speed_cell(p.speedup, t.trustworthy)}, IQR {t.low:.2f}–{t.high:.2f}×; ideal "
            f"{p.ideal_speedup:.2f}× (FLOPs) / {p.roofline_speedup:.2f}× (roofline)."
            + (f" ⚠ {_e(t.note)}." if t.note else "") + "</p>")


def _drift(r, fig) -> str:
    d = r.to_dict()
    return (f"<h2>Drift: {r.prompt_tokens} prompt tokens, skipped {_e(describe(r.skip_layers))}</h2>"
            "<p>Cosine similarity of POP's hidden states, K and V cache entries (prompt tokens) "
            "and decode-time attention outputs to the full model's.</p>"
            + fig(drift_charts.drift_panels(d, r.skip_layers, reference=PAPER_DRIFT)) + fig(drift_charts.decode_steps_chart(r.kl, r.top1_agree)))


def _drift_b(r, fig) -> str:
    return _drift(r, fig).replace("<h2>Drift:", "<h2>Drift, pinned run B:", 1)


def _heal_drift(r: dict, fig) -> str:
    h, end = r["heal"], r["horizon"]
    return (f"<h2>Drift while healing: {r['prompt_tokens']} prompt tokens, skipped "
            f"{_e(describe(r['skip_layers']))}</h2><p>Budget {h['budget_positions']} positions per "
            f"step in chunks of {h['chunk']}: "
            + (f"the cache was the full model's after {end} tokens.</p>" if end is not None else
               f"the answer ended first ({r['healed'][-1]} positions healed).</p>")
            + fig(drift_charts.healing_chart(r, "v")))


def _drift_length(rows, fig) -> str:
    return ("<h2>Drift vs context length</h2>" + fig(drift_charts.drift_length_chart(rows))
            + _table(rows, ["length", "hidden_cos", "k_cos", "v_cos", "attn_out_cos", "kl"]))


def speed_cell(v, trustworthy, rounds=None) -> str:
    """A measured ratio as the pages show it: a flagged one never reads as a plain number."""
    if v is None or v != v:
        return ""
    if rounds == 0 and trustworthy is True:
        return f"{v:.2f}× (reference)"
    return f"{v:.2f}×" if trustworthy is True else f"⚠ {v:.2f}× (flagged)"


def _sweep(r, fig) -> str:
    rows = [{**x, "prefill_speedup": speed_cell(x.get("prefill_speedup"),
                                                x.get("timing_trustworthy"), x.get("timing_rounds")),
             "timing_note": x.get("timing_note") or ""} for x in r.rows]
    flagged = sum(1 for x in r.rows if x.get("timing_trustworthy") is not True)
    return (f"<h2>Sweep ({_e(r.kind)}): {_e(r.model)}</h2><p class=note>{_e(r.data)} · "
            f"{_e(r.device)} · {r.threads} threads</p>"
            + (f"<p class=note>⚠ {flagged} speed figure(s) flagged by the timing protocol (the "
               "reason in the last column): not figures to quote.</p>" if flagged else "")
            + _table(rows, [c for c in ("variant", "skip_ratio", "skip_layers", "length",
                                        "prefill_speedup", "ideal_speedup", "greedy_agreement",
                                        "continuation_nll", "n", "timing_note")
                            if any(c in x for x in r.rows)]))


def _importance(r, fig) -> str:
    titles = {k: f"{METHODS[k.split('.')[0]].title} · {k.split('.', 1)[1]}" for k in r.series}
    return (f"<h2>Importance methods: {_e(r.dataset)}, {r.n_samples} prompts</h2>"
            "<p>Every method's per-layer importance (larger = more important), normalised, and "
            "how their rankings agree.</p>"
            + fig(methods_charts.curves_chart(r.series, titles, [primary(m) for m in r.methods]))
            + fig(methods_charts.agreement_heatmap(r.agreement)))


def _method_compare(r, fig) -> str:
    titles = {m: v.title for m, v in METHODS.items()}
    return (f"<h2>Which method picks the best prefill skip set ({r.n} held-out items)</h2><ul>"
            + "".join(f"<li>{_e(v['line'])}</li>" for v in r.verdicts) + "</ul>"
            + "".join(fig(methods_charts.frontier_chart(r.rows, shape, titles))
                      for shape in r.config["shapes"]))


def _choice(r, fig) -> str:
    from pop_analysis.experiments.choose import Budget, outcome_line  # torch: only for a report

    chart = methods_charts.candidates_chart(r.candidates, r.budget.get("max_delta_nll"), r.chosen)
    return (f"<h2>Budgeted choice ({_e(METHODS[r.method].title)}, {_e(r.shape)} sets)</h2>"
            f"<p>{_e(outcome_line(r, Budget(**r.budget)))}</p>" + fig(chart)
            + _table(r.candidates, ["phase", "k", "set", "continuation_nll_delta", "next_token_top1",
                                    "meets"]))


def _certificate(r, fig) -> str:
    return (f"<h2>Certified choice ({_e(METHODS[r.method].title)}, {_e(r.shape)} sets)</h2>"
            f"<p>{_e(r.statement)}</p><p>{_e(r.note)}</p><p>Not covered: {_e(r.not_covered)}</p>"
            + _table(r.splits, ["role", "source", "offset", "n", "fingerprint"])
            + _table(r.sequence, ["set", "selection_rate", "tested", "bad", "n", "upper", "passed"]))


def _stepthrough(r, fig) -> str:
    rows = [{"run": s["run"], "step": s["stage"], "ms": s["time_ms"],
             "FLOPs vs full prefill": s["flops"] / r.full_prefill_flops,
             "token": (s["token"] or [None, ""])[1]} for s in r.steps]
    t = r.ttft
    return (f"<h2>Step-through: {_e(r.prompt)} ({len(r.prompt_ids)} tokens), skipped "
            f"{_e(describe(r.skip_layers))}</h2>"
            f"<p>First token: full {t['full_ms']:.0f} ms, POP {t['pop_ms']:.0f} ms (medians of "
            f"{t['rounds']} rounds); speedup {speed_cell(t['speedup'], t['trustworthy'])} (IQR "
            f"{t['low']:.2f}–{t['high']:.2f}×; FLOP ideal {r.ideal_speedup:.2f}×)"
            + (f" ⚠ {_e(t['note'])}." if t["note"] else ".") + "</p>"
            + fig(step_charts.clock(r.steps, r.steps[0], "a step of its run's median round"
                                    if "clock" in t else "the step's median"))
            + _table(rows))


SECTIONS = ((state.STEPTHROUGH, _stepthrough), (state.CALIBRATION, _calibration),
            (state.GENERATION, _generation),
            (state.DRIFT, _drift), (state.DRIFT_B, _drift_b), (state.DRIFT_LENGTH, _drift_length),
            (state.SWEEP, _sweep), (state.IMPORTANCE, _importance),
            (state.METHOD_COMPARE, _method_compare), (state.CHOICE, _choice),
            (state.CERTIFICATE, _certificate), (state.HEAL_DRIFT, _heal_drift))


def button(where=None) -> None:
    """The sidebar's download button for the report (built only when clicked)."""
    snap = snapshot()
    (where or st.sidebar).download_button(
        "Report of this session (HTML)", lambda: build(snap), "poplab_report.html", "text/html",
        key="report.download", on_click="ignore", width="stretch",
        help="one offline HTML page with the model, skip set and every current result")
