"""Panels: the sections pages are made of, drawn with streamlit from session state and charts. A
panel that belongs to one page is named `<page>_<what>` (`generate_lens`, `generate_speed`,
`generate_text`, `drift_runs`, `serve_engines`); one that several pages use has a plain name
(`widgets`: the sidebar, the skip-set badge and editor, pickers; `exports`: downloads of a page's
data and figures; `kv_repair`: stored K/V repairs; `model_compare`). Panels
never import pages."""
