"""The model engine: the adapter (the only code that knows Hugging Face internals) and its cache, the model registry and loading, hub access, skip sets, POP prefill / decode, generation, call counters and the trunk shared by variants.

May import: store (cache paths).
"""
