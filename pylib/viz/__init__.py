"""Figures and interactive explorers, drawn from real runs (traces, timelines, sharding specs) and from
`pylib.analysis`. Every figure function returns a matplotlib Figure and works in light and dark themes."""
