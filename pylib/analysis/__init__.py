"""Formulas as pure functions of sizes: traffic, memory, bubble, and the planner built on them.

No processes here: every function takes sizes (a ModelConfig, a ParallelConfig, batch and sequence lengths) and
returns numbers. The tests check each formula against the tracer and the memory probes on real runs at small
sizes, and the book evaluates the same functions at real model sizes. One module per parallelism.
"""
