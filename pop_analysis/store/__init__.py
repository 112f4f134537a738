"""Results cache under cache/ (JSON / safetensors, never pickle), the checks a stored record must pass, and the schema of stored rows.

The lowest layer: imports only errors/progress.
"""
