"""The presenter's view and the keyboard: large type, darker captions, the sidebar collapsed, fewer
controls and projector-sized charts (`plot`), switched by a sidebar toggle or `?present=1`;
arrow keys and space step through the step-through, PageDown / PageUp move between pages.

Streamlit has no key events of its own: a script in the app's own document (st.html with
JavaScript, added once per page load) clicks the buttons and sidebar links a user would click, so
every key goes through the same callbacks and URL as a mouse.
"""
from __future__ import annotations

import streamlit as st

from dashboard.charts.style import for_projector
from dashboard.session import state

TOGGLE = "w.present"
COLLAPSED = "lab.present_collapsed"  # the sidebar was collapsed once for this presenter's view

BASE_CSS = """<style>
[data-testid="stCaptionContainer"], [data-testid="stCaptionContainer"] p { color: #3a3a3a; }
</style>"""
PRESENT_CSS = """<style>
html { font-size: 21px; }
[data-testid="stMainBlockContainer"] { max-width: 100%; padding: 3.4rem 2.4rem 4rem 2.4rem; }
[data-testid="stCaptionContainer"], [data-testid="stCaptionContainer"] p
  { color: #222; font-size: 0.9rem; }
h1 { font-size: 2.2rem !important; }
</style>"""

KEYS_JS = """<script>
(function () {
  if (window.__popLabKeys) return;
  window.__popLabKeys = true;
  // A box the user types into keeps its keys; a toggle, checkbox, radio or button that was
  // just clicked (the presenter's switch itself) does not: it takes no typed keys.
  const notTyped = ["checkbox", "radio", "button", "submit", "reset", "range", "file"];
  const typing = el => el && ((el.tagName === "INPUT" && !notTyped.includes(el.type))
                              || ["TEXTAREA", "SELECT"].includes(el.tagName)
                              || el.isContentEditable);
  const press = key => {
    const b = document.querySelector(".st-key-" + key + " button");
    if (!b || b.disabled) return false;
    b.click();
    return true;
  };
  const page = step => {
    const links = [...document.querySelectorAll('[data-testid="stSidebarNav"] a')];
    if (!links.length) return false;
    let i = links.findIndex(a => new URL(a.href).pathname === location.pathname);
    if (i < 0) i = 0;
    const j = Math.min(links.length - 1, Math.max(0, i + step));
    if (j !== i) links[j].click();
    return true;
  };
  const keys = {ArrowRight: () => press("step-next"), ArrowLeft: () => press("step-prev"),
                " ": () => press("step-play"), PageDown: () => page(1), PageUp: () => page(-1)};
  document.addEventListener("keydown", e => {
    if (typing(document.activeElement) || e.ctrlKey || e.metaKey || e.altKey) return;
    const act = keys[e.key];
    if (act && act()) e.preventDefault();
  }, true);
})();
</script>"""

COLLAPSE_JS = """<script>
(function () {
  const side = document.querySelector('[data-testid="stSidebar"]');
  const button = document.querySelector('[data-testid="stSidebarCollapseButton"] button');
  if (side && side.getAttribute("data-collapsed") === "false" && button) button.click();
})();
</script>"""


def _on_toggle() -> None:
    on = bool(st.session_state[TOGGLE])
    st.session_state[state.PRESENT] = on
    st.session_state[COLLAPSED] = False


def toggle(where=None) -> None:
    """The sidebar switch (kept in step with ?present=1)."""
    state.sync(TOGGLE, state.presenting())
    (where or st.sidebar).toggle("Presenter's view", key=TOGGLE, on_change=_on_toggle,
                                 help="large type, sidebar collapsed, fewer controls, charts sized "
                                      "for a projector; PageDown / PageUp change page")


def apply() -> None:
    """Styles for this run, the keyboard script, and the sidebar collapsed on entering the view."""
    st.html(PRESENT_CSS if state.presenting() else BASE_CSS)
    st.sidebar.html(KEYS_JS, unsafe_allow_javascript=True)
    if state.presenting() and not st.session_state.get(COLLAPSED):
        st.session_state[COLLAPSED] = True
        st.sidebar.html(COLLAPSE_JS, unsafe_allow_javascript=True)


def plot(fig, key: str, where=None, projector_height: int | None = None, title: bool = True,
         projector_layout: dict | None = None, **kw) -> None:
    """st.plotly_chart with the chart sized for a projector in the presenter's view (at
    `projector_height` pixels where a page must fit a screen, without its title where the page
    already says it, with `projector_layout` on top), and the mode bar shown on hover only,
    below the title's line."""
    if state.presenting():
        fig = for_projector(fig, projector_height, title)
        fig.update_layout(projector_layout or {})
    kw.setdefault("config", {"displaylogo": False})
    (where or st).plotly_chart(fig, key=key, **kw)
