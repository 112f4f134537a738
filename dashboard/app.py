"""POP Lab dashboard: entry point (`streamlit run dashboard/app.py`), router and frame.

The sidebar (model, device, dtype, memory, unload, the skip set and its editor, runs in
progress) is drawn here for every page; pages live in the top-level pages/ folder, resolved from
the repository root so the app starts from any working directory. Each run first keeps the
inputs that must survive a page change, applies a shared link once per session, files the
results of finished background runs, and writes the current view back into the URL.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard.panels import widgets
from dashboard.session import jobs, links, report, state

ROOT = Path(__file__).resolve().parent.parent  # pages/ is resolved from here: any working directory

PAGES = (  # (file in pages/, title, icon, url path)
    ("overview.py", "Overview", ":material/school:", "overview"),
    ("calibrate.py", "Calibrate", ":material/insights:", "calibrate"),
    ("methods.py", "Methods", ":material/compare:", "methods"),
    ("skip_set.py", "Skip set", ":material/layers:", "skip_set"),
    ("generate.py", "Generate", ":material/chat:", "generate"),
    ("drift.py", "Drift", ":material/compare_arrows:", "drift"),
    ("sweeps.py", "Sweeps", ":material/monitoring:", "sweeps"),
    ("serve.py", "Serve", ":material/dns:", "serve"),
)

st.set_page_config(page_title="POP Lab", page_icon="✂️", layout="wide")
state.remember_inputs()
links.apply_link()
nav = st.navigation([st.Page(ROOT / "pages" / f, title=t, icon=i, url_path=u, default=(u == "overview"))
                     for f, t, i, u in PAGES])

st.sidebar.title("✂️ POP Lab")
widgets.model_form()
lm = widgets.current_model()
widgets.model_panel(lm)
jobs.collect()
if lm is not None:
    st.sidebar.divider()
    widgets.skip_badge(lm)
for line in jobs.running_summary():
    st.sidebar.caption(f"Running: {line}")
query = links.write_link(st.session_state.get(state.SKIP))
st.sidebar.divider()
report.button()
st.sidebar.caption(f"Share: the address bar links to this page, model and skip set (`?{query}`).")

nav.run()
