"""Figures, tables and interactive explorers, drawn from real runs (traces, timelines, sharding specs) and from
`pylib.analysis`. Every figure function returns a matplotlib Figure; `style` holds the shared look that reads in
the site's light and dark themes. Nothing here launches ranks: the runs are `pylib.experiments`.

    style        the book's matplotlib style (card background, palette, contrast checks)
    layer_flow   article A's Pre-LN layer as six stages (from `pylib.seedcheck.layer_flow`)
    three_axes   which elements of [b, s, d] each rank holds, one panel per parallelism
    matrix_dims  article B's matrix view: dimensions each mode cuts, column/row shards, the FFN superposition
    tp cp ep pp dp   one module per parallelism: the figure that makes each strategy click
    explorer     Part II's per-rank shapes / memory / traffic explorer (ipywidgets, and a form for the static site)
    live         the static site's explorers: plain HTML forms computed in the page by pylib itself (Pyodide)
    compose      the rank mesh, token placement and per-rank report of a composed run
    planner      plans measured against predictions, plan tables, Part I's plan explorer (ipywidgets)

Import from the module: `from pylib.viz.pp import plot_timeline`. Tables as text (`markdown_table`, `text_table`,
`fmt_bytes`, ...) are `pylib.tables`, below both this package and `pylib.seedcheck`, which print them too.
"""
