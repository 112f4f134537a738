"""Closed-form K/V repair beyond the paper: fitting ridge maps, storing and loading them, and their held-out evaluation.

May import: quality and every layer below it.
"""
