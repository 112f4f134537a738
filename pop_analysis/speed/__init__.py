"""Speed: the one timing protocol, machine rates, FLOP and roofline ideals, and the TTFT bench.

May import: data, engine, store.
"""
