"""Charts: pure plotly figure builders. Plain data in, a `plotly.graph_objects.Figure` out; no
streamlit and no model, so each builder is tested on its own and the CLI's report can use it. One
module per page it draws for (`calibrate`, `generate`, `drift`, `sweeps`, `serve`), plus what
several pages share: `style` (colours per meaning, the layout frame, shading of skipped layers),
`axes` (honest log and linear ranges), `layers` (the layer stack: what runs where, the clickable
strip, call counts) and `overlays` (stored runs drawn over a page's chart)."""
