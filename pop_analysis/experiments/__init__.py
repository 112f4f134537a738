"""Experiments composed from the layers below: sweeps (a quality half and a speed half), the reproduction report of the paper's tables, and the paper's own numbers.

May import: harness and every layer below it.
"""
