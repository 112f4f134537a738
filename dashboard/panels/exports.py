"""Downloads on every page: the page's data (CSV, JSON) and its figures (HTML with plotly's
JavaScript inlined, so a saved figure opens offline; the chart's own camera button gives PNG).

Files are made only when the user clicks (Streamlit calls the data function then), so a page
pays nothing for offering a 5 MB figure.
"""
from __future__ import annotations

import csv
import io
import json

import streamlit as st

from dashboard.session import state
from pop_analysis.store.schema import plain


def csv_text(rows: list[dict]) -> str:
    """Rows of dicts -> CSV with the union of their keys (lists joined by spaces)."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, cols, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: " ".join(map(str, v)) if isinstance(v, (list, tuple)) else v
                    for k, v in plain(r).items()})
    return buf.getvalue()


def json_text(data) -> str:
    return json.dumps(plain(data), indent=1)


def figure_html(fig, include_js: bool | str = True) -> str:
    """A standalone HTML page of one figure; include_js=True inlines plotly.js (offline)."""
    return fig.to_html(include_plotlyjs=include_js, full_html=True)


def offer(name: str, data=None, rows: list[dict] | None = None, figures: dict | None = None,
          where=st) -> None:
    """A row of download buttons: data as CSV and JSON, each figure as HTML (none in the
    presenter's view: fewer controls on a projector)."""
    if state.presenting():
        return
    buttons = []
    if rows:
        buttons.append(("Data (CSV)", lambda: csv_text(rows), f"{name}.csv", "text/csv"))
    if data is not None:
        buttons.append(("Data (JSON)", lambda: json_text(data), f"{name}.json", "application/json"))
    for title, fig in (figures or {}).items():
        buttons.append((f"Figure: {title.replace('_', ' ')} (HTML)",
                        lambda fig=fig: figure_html(fig), f"{name}_{title}.html", "text/html"))
    if not buttons:
        return
    with where.expander("Download this page's data and figures", expanded=False):
        cols = st.columns(min(len(buttons), 4))
        for i, (label, make, file_name, mime) in enumerate(buttons):
            cols[i % len(cols)].download_button(label, make, file_name, mime, on_click="ignore",
                                                key=f"dl.{name}.{file_name}")
        st.caption("Figures are interactive HTML pages that open offline; a chart's camera "
                   "button (top right, on hover) saves a PNG.")
