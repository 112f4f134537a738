"""Serving POP with vLLM: a local OpenAI-compatible engine started as a subprocess of the serving
venv (.venv-vllm), a load test through vLLM's own benchmark code, both spoken to over HTTP on
127.0.0.1. Nothing here imports vLLM: the engine and the load generator run in the serving venv's
Python, this package only builds their commands and reads what they answer.
"""
