"""Quality: evaluation items and sets, answer parsing, metrics, batched evaluation, statistics (SciPy) and intervals, and the synthetic retrieval task.

May import: inspection and every layer below it.
"""
