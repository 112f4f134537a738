"""Prompt sets: built-in prompts, bounded readers of local files (JSONL, JSON, CSV, Parquet, TXT), hub data sets and the allowed-path rule.

May import: engine, store.
"""
