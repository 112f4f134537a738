"""Per-layer importance: virtual gates, Fisher sampling and gradients, calibration with its batch plan, and skip-set suggestions from the scores.

May import: speed, data, engine, store.
"""
