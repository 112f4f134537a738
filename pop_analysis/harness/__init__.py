"""lm-evaluation-harness: the model wrapper registered with lm-eval, its task templates, and the multiple-choice evaluation built on them.

May import: repair and every layer below it (pop_repair needs stored repairs).
"""
