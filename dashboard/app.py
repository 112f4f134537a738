"""POP Lab dashboard: entry point (`streamlit run dashboard/app.py`), router and frame.

The sidebar (model, device, dtype, memory, unload, the skip set and its editor, runs in
progress, the presenter's view) is drawn here for every page; pages live in the top-level pages/
folder, resolved from the repository root so the app starts from any working directory. Each run
first keeps the inputs that must survive a page change and applies a shared link once per
session. The model loads on a thread of its own: pages draw what needs no model (text, stored
examples) at once. Once it is loaded, the session shows that model's results (another model's
are put away, never drawn through this one), fills pages without a result with the stored
examples, files the results of finished background runs, and writes the view into the URL.
Nothing imported here imports torch: the first page must not wait for it.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard.panels import presenter, widgets
from dashboard.session import classmode, jobs, links, precision_state, report, state

ROOT = Path(__file__).resolve().parent.parent  # pages/ is resolved from here: any working directory

PAGES = (  # (file in pages/, title, icon, url path)
    ("overview.py", "Overview", ":material/school:", "overview"),
    ("stepthrough.py", "Step through", ":material/slideshow:", "stepthrough"),
    ("calibrate.py", "Calibrate", ":material/insights:", "calibrate"),
    ("methods.py", "Methods", ":material/compare:", "methods"),
    ("skip_set.py", "Skip set", ":material/layers:", "skip_set"),
    ("generate.py", "Generate", ":material/chat:", "generate"),
    ("drift.py", "Drift", ":material/compare_arrows:", "drift"),
    ("sweeps.py", "Sweeps", ":material/monitoring:", "sweeps"),
    ("serve.py", "Serve", ":material/dns:", "serve"),
)

st.set_page_config(page_title="POP Lab", page_icon="✂️", layout="wide",
                   initial_sidebar_state="collapsed" if links.presenting_link() else "auto")
state.remember_inputs()
widgets.start_run()
links.apply_link()
nav = st.navigation([st.Page(ROOT / "pages" / f, title=t, icon=i, url_path=u, default=(u == "overview"))
                     for f, t, i, u in PAGES])
presenter.apply()

st.sidebar.title("✂️ POP Lab")
widgets.model_form()
lm = widgets.current_model()
widgets.model_panel(lm)
skip, int8 = None, ()
if lm is not None:
    state.follow_model(lm.name)
    classmode.fill(lm.name, lm.adapter.n_layers)
jobs.collect()
if lm is not None:
    st.sidebar.divider()
    widgets.skip_badge(lm)
    skip = st.session_state.get(state.SKIP)
    int8 = precision_state.int8_for(lm.adapter.n_layers, skip or ())
for line in jobs.running_summary():
    st.sidebar.caption(f"Running: {line}")
query = links.write_link(skip, nav.url_path, int8)
if state.link_skip_error():
    st.error(state.link_skip_error())
st.sidebar.divider()
presenter.toggle()
report.button()
st.sidebar.caption(f"Share: the address bar links to this page, model, skip set and int8 layers (`?{query}`).")

nav.run()
