"""Looking inside a run: drift of hidden states, K, V and attention output (per token and against context length) and the logit lens.

May import: importance, speed, data, engine, store.
"""
