"""POP Lab: Prefill-Only Pruning (POP) of large language models, as a library.

Never imports streamlit: the dashboard is a face on this engine.
"""
__version__ = "0.1.0"
