"""Session plumbing: what every page shares and nothing draws. `state` holds one canonical value
per fact (the skip set, the model, kept inputs) and the typed spec pages read through;
`resources` keeps one model per (name, device, dtype) for every page and session, with its run
lock; `jobs` runs long work on a worker thread with progress, ETA and cancel; `links` puts the
model and skip set in the URL; `cached` memoises reads of the results store; `report` builds the
session's offline HTML report. Nothing here imports a panel or a page."""
