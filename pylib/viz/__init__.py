"""Figures and interactive explorers, drawn from real runs (traces, timelines, sharding specs) and from
`pylib.analysis`. Every figure function returns a matplotlib Figure; `style` holds the shared look that reads in
the site's light and dark themes.

    style      the book's matplotlib style (card background, palette, contrast checks)
    seed_a     Part I: layer flow, split checks, three axes, printed-number comparison
    seed_b     Part II: meta-device tables, seed B's tables as data, cell-by-cell judging; seed_b_ranks probes
    tp cp ep pp dp   one module per parallelism: the figure that makes each strategy click
    explorer   Part II's per-rank shapes / memory / traffic explorer (ipywidgets, with a static default)
    compose    the rank mesh, token placement and per-rank report of a composed run
    planner    plans measured against predictions, plan tables, Part I's plan explorer (ipywidgets)

Import from the module: `from pylib.viz.pp import plot_timeline`.
"""
